"""Writes tests/data/goldens/<model>.<dtype>.json with Transformers itself.

For every model folder named in MODELS (tests/data/models/) and dtype float32 / bfloat16, the
checkpoint is loaded with AutoModelForCausalLM.from_pretrained(dir, dtype=dtype,
attn_implementation="eager") on CPU (a bf16 checkpoint is upcast for float32), and recorded:
  * the logits of every position of a few fixed prompts (one forward of the whole prompt);
  * 16 greedy tokens, each from a full recompute of the whole sequence (first index among equal
    maxima, no eos stop), and the top-1 minus top-2 margin of each step.

Before writing, it checks Transformers against itself:
  * generate(do_sample=False, cache_implementation="static") gives the full-recompute tokens (in
    float32 exactly; in bfloat16 up to the first step whose margin is below BF16_TIE, where the
    cached and recomputed paths may round a near-tie differently);
  * the first greedy token is the argmax of the prompt's last-position logits;
  * each JSON file reads back to exactly the computed values.
It prints the worst relative row error between the bf16 and f32 logits, the scale a bf16
implementation can expect.

Run: .venv/bin/python tools/reference/make_goldens.py [MODEL ...] (all models without names)
"""

import json
import os
import sys

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, GenerationConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS_DIR = os.path.join(ROOT, "tests", "data", "models")
OUT_DIR = os.path.join(ROOT, "tests", "data", "goldens")
TINY_MODELS = [
    "tiny-qwen3", "tiny-qwen3-sharded", "tiny-qwen2", "tiny-llama", "tiny-llama-sharded",
    "tiny-mistral", "tiny-glm4", "tiny-glm", "tiny-gemma3", "tiny-llama-longrope",
]
HF_MODELS = ["hf-llama", "hf-qwen2", "hf-qwen3", "hf-mistral", "hf-glm", "hf-glm4", "hf-gemma3",
             "hf-qwen3-moe", "hf-mixtral", "hf-glm4-moe", "hf-gpt-oss", "hf-gpt-oss-mxfp4",
             "hf-qwen3-next", "hf-qwen3-5", "hf-qwen3-5-moe", "hf-qwen3-5-vl", "hf-gemma4",
             "hf-gemma4-moe", "hf-gemma4-vl"]
MODELS = TINY_MODELS + HF_MODELS
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
MAX_NEW_TOKENS = 16
# Below this margin a bf16 greedy step is a near-tie that two correct bf16 paths may decide
# differently (the C++ bf16 test stops comparing there too).
BF16_TIE = 0.25

# Fixed prompts (all ids < 512, the tiny vocab): lengths 1, 4, 11 and 20; the last two are longer
# than every sliding window of the tiny models (4, 6, 8).
PROMPTS = [
    [1],
    [1, 17, 300, 45],
    [1, 400, 3, 3, 3, 9, 200, 51, 7, 7, 128],
    [1, 93, 511, 0, 256, 77, 310, 4, 4, 190, 22, 480, 61, 135, 8, 299, 402, 17, 250, 33],
]


def check_versions():
    # The goldens are only reproducible with the pinned versions (pyproject.toml, group
    # "reference"); another version may change rounding or defaults.
    want = {"transformers": "5.23.0", "torch": "2.15.0"}
    got = {"transformers": transformers.__version__, "torch": torch.__version__.split("+")[0]}
    if got != want:
        sys.exit(f"needs {want}, found {got}: run with the project's .venv "
                 "(scripts/setup.sh --dev)")


def setup_torch():
    # One thread and deterministic kernels: the same files on every run.
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()


def load(name, dtype):
    path = os.path.join(MODELS_DIR, name)
    with open(os.path.join(path, "config.json")) as f:
        quant = json.load(f).get("quantization_config") or {}
    # MXFP4 experts (gpt-oss) dequantized by Transformers itself, as it runs them on a CPU.
    extra = ({"quantization_config": transformers.Mxfp4Config(dequantize=True)}
             if quant.get("quant_method") == "mxfp4" else {})
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager",
                                                 **extra)
    return model.eval()


def rel_err(a, b):
    """max |a - b| / max |b| over each position's row, then the worst row (the metric the C++
    golden tests use)."""
    a = a.double()
    b = b.double()
    return float(((a - b).abs().amax(-1) / b.abs().amax(-1)).max())


@torch.no_grad()
def prompt_logits(model, ids):
    """Logits of every position, in the model's dtype, as float32 (bf16 values are exact)."""
    return model(torch.tensor([ids])).logits[0].float()


@torch.no_grad()
def greedy_full(model, ids, n):
    """n greedy tokens, the whole sequence recomputed each step (no cache), no eos stop."""
    seq = list(ids)
    tokens, margins = [], []
    for _ in range(n):
        last = model(torch.tensor([seq]), use_cache=False).logits[0, -1].float()
        # torch.argmax returns the first index among equal maxima.
        tok = int(torch.argmax(last))
        top2 = torch.topk(last, 2).values
        tokens.append(tok)
        margins.append(float(top2[0] - top2[1]))
        seq.append(tok)
    return tokens, margins


@torch.no_grad()
def generate(model, ids, cfg, **kwargs):
    """model.generate() with exactly the eos ids of `cfg`: generate() fills an unset
    eos_token_id from the model's generation_config, so that one is cleared meanwhile."""
    saved = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = None
    try:
        return model.generate(ids, generation_config=cfg, **kwargs)
    finally:
        model.generation_config.eos_token_id = saved


def greedy_static(model, ids, n):
    """generate() with a static KV cache, no eos id (it must not stop early)."""
    cfg = GenerationConfig(do_sample=False, max_new_tokens=n, cache_implementation="static",
                           eos_token_id=None, pad_token_id=0, bos_token_id=1)
    inp = torch.tensor([ids])
    out = generate(model, inp, cfg, attention_mask=torch.ones_like(inp))
    assert out.shape[1] == len(ids) + n, "generate() stopped early"
    return out[0, len(ids):].tolist()


def fmt(x):
    # numpy prints the shortest decimal that reads back as the same float32 (bf16 values are
    # exactly representable in float32, so they read back exactly too).
    assert np.isfinite(x), "non-finite value"
    return str(np.float32(x))


def write_golden(path, header, cases):
    lines = ["{"]
    for k, v in header.items():
        lines.append(f"  {json.dumps(k)}: {json.dumps(v)},")
    lines.append('  "cases": [')
    for ci, case in enumerate(cases):
        lines.append("    {")
        lines.append(f'      "input_ids": {json.dumps(case["input_ids"])},')
        lines.append(f'      "greedy": {json.dumps(case["greedy"])},')
        margins = ", ".join(fmt(m) for m in case["greedy_margins"])
        lines.append(f'      "greedy_margins": [{margins}],')
        lines.append('      "logits": [')
        rows = case["logits"]
        for ri, row in enumerate(rows):
            sep = "," if ri + 1 < len(rows) else ""
            lines.append("        [" + ", ".join(fmt(x) for x in row) + "]" + sep)
        lines.append("      ]")
        lines.append("    }" + ("," if ci + 1 < len(cases) else ""))
    lines.append("  ]")
    lines.append("}")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    # It must parse as JSON and hold what was computed.
    with open(path) as f:
        back = json.load(f)
    for case, got in zip(cases, back["cases"]):
        assert got["greedy"] == case["greedy"]
        assert np.array_equal(np.array(got["logits"], dtype=np.float32), case["logits"])


def checkpoint_dtype(name):
    with open(os.path.join(MODELS_DIR, name, "config.json")) as f:
        config = json.load(f)
    # Transformers 5 writes "dtype", earlier versions "torch_dtype".
    return config.get("dtype") or config.get("torch_dtype")


def record(name, dtype_name):
    """The golden cases of one model and dtype, self-checked."""
    model = load(name, DTYPES[dtype_name])
    cases = []
    for ids in PROMPTS:
        logits = prompt_logits(model, ids)
        tokens, margins = greedy_full(model, ids, MAX_NEW_TOKENS)
        assert tokens[0] == int(torch.argmax(logits[-1])), f"{name}: first greedy token"
        cached = greedy_static(model, ids, MAX_NEW_TOKENS)
        if dtype_name == "float32":
            assert cached == tokens, f"{name} f32: static-cache greedy {cached} != {tokens}"
        else:
            for k, (a, b) in enumerate(zip(cached, tokens)):
                if margins[k] < BF16_TIE:
                    break
                assert a == b, f"{name} bf16 step {k}: static-cache {a} != full recompute {b}"
        cases.append({"input_ids": ids, "greedy": tokens, "greedy_margins": margins,
                      "logits": logits.numpy().astype(np.float32),
                      "static_agrees": cached == tokens})
    return cases


def write_model(name):
    per_dtype = {}
    for dtype_name in DTYPES:
        cases = record(name, dtype_name)
        per_dtype[dtype_name] = cases
        header = {
            "model": name,
            "dtype": dtype_name,
            "checkpoint_dtype": checkpoint_dtype(name),
            "max_new_tokens": MAX_NEW_TOKENS,
            "generator": "tools/reference/make_goldens.py (transformers "
                         f"{transformers.__version__}, torch {torch.__version__.split('+')[0]})",
        }
        path = os.path.join(OUT_DIR, f"{name}.{dtype_name}.json")
        write_golden(path, header, cases)
        min_margin = min(min(c["greedy_margins"]) for c in cases)
        static = sum(c["static_agrees"] for c in cases)
        print(f"{name:20s} {dtype_name:9s} {os.path.getsize(path) / 1024:7.1f} KiB  "
              f"min greedy margin {min_margin:.4f}  static cache = full recompute on "
              f"{static}/{len(cases)} prompts")
        for c in cases:
            print(f"    {len(c['input_ids']):2d} tokens -> greedy {c['greedy']}")
    err = max(rel_err(torch.from_numpy(b["logits"]), torch.from_numpy(f["logits"]))
              for f, b in zip(per_dtype["float32"], per_dtype["bfloat16"]))
    same = sum(f["greedy"] == b["greedy"] for f, b in zip(per_dtype["float32"],
                                                           per_dtype["bfloat16"]))
    print(f"  {name}: bf16 vs f32 logits rel {err:.2e}, greedy equal on {same}/{len(PROMPTS)}")


def main(names):
    check_versions()
    setup_torch()
    os.makedirs(OUT_DIR, exist_ok=True)
    for name in names or MODELS:
        write_model(name)


if __name__ == "__main__":
    main(sys.argv[1:])
