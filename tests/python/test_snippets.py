"""The Transformers TPU guide's snippets (snippets/), run as scripts the way a user runs them."""

import sys

import numpy as np
import pytest

from conftest import KJV, MODELS, SNIPPETS, needs_mpirun, run, tformers_command


def test_first_inference_snippet_prints_the_prompt_and_its_continuation():
    pytest.importorskip("torch")
    r = run([sys.executable, str(SNIPPETS / "first_inference.py")])
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("And the LORD said"), r.stdout
    assert len(r.stdout.split()) > 10, r.stdout


def test_first_inference_with_numpy_tensors():
    # The same snippet where torch is not installed: return_tensors="np", numpy ids back.
    from tformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(KJV)
    model = AutoModelForCausalLM.from_pretrained(KJV, dtype="bfloat16", device_map="auto")
    inputs = tokenizer("And the LORD said", return_tensors="np").to(model.device)
    output = model.generate(**inputs, do_sample=True, max_new_tokens=50, cache_implementation="static")
    assert isinstance(output, np.ndarray) and output.dtype == np.int64
    assert output.shape[0] == 1 and 4 < output.shape[1] <= 4 + 50
    assert (output[0, :4] == inputs["input_ids"][0]).all()
    assert tokenizer.decode(output[0], skip_special_tokens=True).startswith("And the LORD said")


@needs_mpirun
def test_tensor_parallel_snippet_on_two_ranks_prints_once_what_one_process_generates():
    from tformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(KJV)
    whole = AutoModelForCausalLM.from_pretrained(KJV, dtype="float32")
    ids = whole.generate(**tokenizer("And the LORD said", return_tensors="np"), do_sample=False, max_new_tokens=20)
    expected = tokenizer.decode(ids[0], skip_special_tokens=True)

    r = run([tformers_command(), "launch", "--nproc-per-node", "2", "--", sys.executable,
             str(SNIPPETS / "tensor_parallel.py")])
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [expected], r.stdout


@needs_mpirun
def test_glm4_tp_plan_override_on_four_ranks_matches_the_whole_model():
    r = run([tformers_command(), "launch", "--nproc-per-node", "4", "--", sys.executable,
             str(SNIPPETS / "glm4_tp_plan.py"), str(MODELS / "tiny-glm4")])
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ranks 4 same True "), r.stdout
