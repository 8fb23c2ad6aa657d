"""Hub kernels from Python, with the names Transformers and Hugging Face's kernels library use:

    model = AutoModelForCausalLM.from_pretrained(path, use_kernels=True)
    model = AutoModelForCausalLM.from_pretrained(
        path, use_kernels=True,
        kernel_config=KernelConfig({"RMSNorm": "tformers-community/fused-norms:RMSNorm"}))
    model = kernelize(model, mode="inference")

A mapping names, for each replaceable layer (RMSNorm, SiLUAndMul, RotaryEmbedding, Attention), a
package "org/name" with an optional major version "@vN" (default 1) and layer ":Name" (default the
layer's own name), for every device or per device ({"cpu": "org/name:RMSNorm"}). Without one,
use_kernels maps the layers of the package built with tformers (default_kernel_mapping()).
Packages come from the kernel cache, pinned by kernels.lock (docs: kernels/README.md and
include/tformers/kernels.h); TFORMERS_LOCAL_KERNELS points a repo at a folder while developing.
"""

import re

from . import _core

_SPEC = re.compile(r"^(?P<repo>[^/@:\s]+/[^/@:\s]+)(?:@v(?P<version>\d+))?(?::(?P<layer>\w+))?$")


class KernelConfig:
    """Transformers' KernelConfig: kernel_mapping maps a layer to "org/name[@vN][:Layer]", or to a
    dict of those by device ("cpu", "tpu", "cuda", "xla-cpu")."""

    def __init__(self, kernel_mapping=None):
        self.kernel_mapping = dict(kernel_mapping or {})


def _repository(spec, layer):
    if not isinstance(spec, str) or not _SPEC.match(spec):
        raise ValueError(f"kernel_mapping[{layer!r}]: {spec!r} is not \"org/name[@vN][:Layer]\" "
                         "(e.g. \"tformers-community/fused-norms@v1:RMSNorm\")")
    m = _SPEC.match(spec)
    return (m["repo"], int(m["version"] or 1), m["layer"] or "")


def _core_mapping(kernel_mapping, device):
    out = {}
    for layer, spec in kernel_mapping.items():
        per_device = spec if isinstance(spec, dict) else {device: spec}
        out[layer] = {dev: _repository(s, layer) for dev, s in per_device.items()}
    return out


def default_kernel_mapping():
    """What use_kernels=True maps without a KernelConfig: {layer: {device: "org/name@vN:Layer"}}."""
    return {layer: {dev: f"{repo}@v{version}:{name or layer}" for dev, (repo, version, name) in devices.items()}
            for layer, devices in _core.default_kernel_mapping().items()}


def kernelize(model, mode=None, kernel_mapping=None, use_fallback=True, local_overrides=None,
              allow_unpinned=False, lock_file=""):
    """Swaps the mapped layers of `model` for hub kernels in every graph compiled from now on, and
    returns the model, as kernels.kernelize does. mode: None or inference (tformers runs inference
    only; Mode.INFERENCE of the kernels library is taken too). Where no kernel fits (device, dtype,
    CPU), the built-in op runs, unless use_fallback is False. model.kernel_layers then lists
    (layer, kernel, note): the kernel chosen ("" for the built-in op) and why."""
    if mode is not None and "inference" not in str(getattr(mode, "name", mode)).lower():
        raise ValueError(f"mode={mode!r}: tformers runs inference only; pass mode=\"inference\" or leave it out")
    if kernel_mapping is None:
        kernel_mapping = default_kernel_mapping()
    mapping = _core_mapping(kernel_mapping, model.device)
    model.kernel_layers = _core.kernelize(model._core, mapping, use_fallback, dict(local_overrides or {}),
                                          allow_unpinned, lock_file)
    return model
