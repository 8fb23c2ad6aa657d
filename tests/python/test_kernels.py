"""Hub kernels from Python as Transformers spells them: from_pretrained(use_kernels=True,
kernel_config=KernelConfig(...)) and kernelize(model, mode=...), with the package this repository
builds (tformers-community/fused-norms, in the release build's kernels/ folder) pointed at by
TFORMERS_LOCAL_KERNELS, as while developing a package."""

import numpy as np
import pytest

from conftest import KJV, REPO

import tformers
from tformers import AutoModelForCausalLM, KernelConfig, kernelize

PACKAGE = REPO / "build" / "release" / "kernels" / "tformers-community" / "fused-norms" / "v1"
PROMPT = [[3, 141, 59, 265, 358, 97, 93, 238, 46, 264]]


@pytest.fixture
def local_package(monkeypatch):
    if not (PACKAGE / "manifest.json").exists():
        pytest.fail(f"{PACKAGE} is missing: build the release preset (scripts/setup.sh) first")
    monkeypatch.setenv("TFORMERS_LOCAL_KERNELS", f"tformers-community/fused-norms={PACKAGE}")
    monkeypatch.setenv("TFORMERS_KERNELS_ALLOW_UNPINNED", "1")


def logits(model):
    return model(np.array(PROMPT, dtype=np.int64)).logits[0].astype(np.float64)


def test_use_kernels_swaps_the_layers_and_keeps_the_logits(local_package):
    builtin = AutoModelForCausalLM.from_pretrained(KJV, dtype="float32")
    model = AutoModelForCausalLM.from_pretrained(KJV, dtype="float32", use_kernels=True)
    chosen = {layer: kernel for layer, kernel, _ in model.kernel_layers}
    assert set(chosen) == {"RMSNorm", "SiLUAndMul"}
    assert all("tformers-community/fused-norms" in k for k in chosen.values()), model.kernel_layers
    want, got = logits(builtin), logits(model)
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-5
    settings = dict(max_new_tokens=12, do_sample=False)
    ids = np.array(PROMPT)
    assert model.generate(ids, **settings).tolist() == builtin.generate(ids, **settings).tolist()


def test_kernel_config_maps_only_what_it_names(local_package):
    config = KernelConfig({"RMSNorm": "tformers-community/fused-norms@v1:RMSNorm"})
    model = AutoModelForCausalLM.from_pretrained(KJV, dtype="float32", use_kernels=True,
                                                 kernel_config=config)
    assert [layer for layer, _, _ in model.kernel_layers] == ["RMSNorm"]
    # kernelize() again with the per-device form, and mode as the kernels library passes it.
    kernelize(model, mode="inference", kernel_mapping={"SiLUAndMul": {"cpu": "tformers-community/fused-norms"}})
    assert [layer for layer, _, _ in model.kernel_layers] == ["SiLUAndMul"]
    assert tformers.kernels.default_kernel_mapping()["RMSNorm"] == {"cpu": "tformers-community/fused-norms@v1:RMSNorm"}


def test_bad_mappings_and_modes_are_errors(local_package):
    model = AutoModelForCausalLM.from_pretrained(KJV, dtype="float32")
    with pytest.raises(ValueError, match="inference only"):
        kernelize(model, mode="training")
    with pytest.raises(ValueError, match="org/name"):
        kernelize(model, kernel_mapping={"RMSNorm": "no-slash"})
    with pytest.raises(ValueError, match="is not a layer that can be replaced"):
        kernelize(model, kernel_mapping={"LayerNorm": "tformers-community/fused-norms"})
    with pytest.raises(ValueError, match="use_kernels=True"):
        AutoModelForCausalLM.from_pretrained(KJV, kernel_config=KernelConfig({}))
