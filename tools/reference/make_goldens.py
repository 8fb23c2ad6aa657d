"""Writes tests/data/goldens/<model>.<dtype>.json from the independent reference (reference.py).

For every tiny model in tests/data/models/ and dtype float32 / bfloat16 (the checkpoint is cast to
that dtype and every op runs in it, as Transformers does after from_pretrained(torch_dtype=...)):
  * the logits of every position of a few fixed prompts;
  * 16 greedy tokens (full recompute each step, first index among equal maxima, no eos stop) and
    the top-1 minus top-2 margin of each step.

Before writing, it checks itself:
  * a step-by-step computation with a KV cache (each new token alone, so no mask is involved)
    gives the logits of the full causal recompute at every position: proves the causal mask;
  * it prints the relative error between the float32 and bfloat16 logits, the scale of error a
    bf16 implementation can expect against the bf16 goldens.

Run: /usr/bin/python3 tools/reference/make_goldens.py [MODEL ...] (all models without names)
"""

import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference import DTYPES, Model, first_argmax, greedy, load_checkpoint  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS_DIR = os.path.join(ROOT, "tests", "data", "models")
OUT_DIR = os.path.join(ROOT, "tests", "data", "goldens")
MODELS = [
    "tiny-qwen3", "tiny-qwen3-sharded", "tiny-qwen2", "tiny-llama", "tiny-llama-sharded",
    "tiny-mistral", "tiny-glm4", "tiny-glm", "tiny-gemma3",
]
MAX_NEW_TOKENS = 16

# Fixed prompts (all ids < 512, the tiny vocab): lengths 1, 4, 11 and 20.
PROMPTS = [
    [1],
    [1, 17, 300, 45],
    [1, 400, 3, 3, 3, 9, 200, 51, 7, 7, 128],
    [1, 93, 511, 0, 256, 77, 310, 4, 4, 190, 22, 480, 61, 135, 8, 299, 402, 17, 250, 33],
]


def rel_err(a, b):
    """max |a - b| / max |b| over each position's row, then the worst row (the metric the C++
    golden tests use)."""
    a = a.double()
    b = b.double()
    return float(((a - b).abs().amax(-1) / b.abs().amax(-1)).max())


def rel_err_l2(a, b):
    """||a - b|| / ||b|| over each position's row, then the worst row."""
    a = a.double()
    b = b.double()
    return float(((a - b).norm(dim=-1) / b.norm(dim=-1)).max())


class Bf16Float32Math(Model):
    """Another plausible bf16 implementation: bf16 weights, float32 math, activations rounded to
    bf16 only where attention and the MLP hand back to the residual stream. Its distance from the
    bf16 goldens estimates what a correct C++ bf16 path that rounds at other points can expect."""

    def attend(self, *args):
        return super().attend(*args).to(torch.bfloat16).float()

    def mlp(self, *args):
        return super().mlp(*args).to(torch.bfloat16).float()


def check_incremental(model, ids):
    full = model.forward(ids)
    cache = model.new_cache()
    # Prefill part of the prompt, then feed one token at a time; a single query row sees every
    # cached key, so these steps do not depend on the mask at all.
    split = max(1, len(ids) // 2)
    steps = [model.forward(ids[:split], cache)]
    for t in range(split, len(ids)):
        steps.append(model.forward([ids[t]], cache))
    inc = torch.cat(steps, dim=0)
    assert inc.shape == full.shape
    return rel_err(inc, full)


def fmt(x):
    # numpy prints the shortest decimal that reads back as the same float32 (bf16 values are
    # exactly representable in float32, so they read back exactly too).
    s = repr(float(np.float32(x))) if not np.isfinite(x) else str(np.float32(x))
    assert np.isfinite(x), "non-finite logit"
    return s


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


def main(names):
    """Writes the goldens of the named models (all without arguments)."""
    os.makedirs(OUT_DIR, exist_ok=True)
    torch.set_num_threads(2)
    summary = []
    for name in names or MODELS:
        config, weights = load_checkpoint(os.path.join(MODELS_DIR, name))
        per_dtype = {}
        for dtype_name, dtype in DTYPES.items():
            model = Model(config, weights, dtype)
            cases = []
            for ids in PROMPTS:
                inc_err = check_incremental(model, ids)
                limit = 1e-5 if dtype == torch.float32 else 1e-1
                assert inc_err < limit, f"{name} {dtype_name}: incremental vs full {inc_err}"
                logits = model.forward(ids).float()
                tokens, margins = greedy(model, ids, MAX_NEW_TOKENS)
                # The greedy loop's first token is the prompt's last-position argmax.
                assert tokens[0] == first_argmax(logits[-1])
                cases.append(
                    {
                        "input_ids": ids,
                        "greedy": tokens,
                        "greedy_margins": margins,
                        "logits": logits.numpy().astype(np.float32),
                        "inc_err": inc_err,
                    }
                )
            per_dtype[dtype_name] = cases
            header = {
                "model": name,
                "dtype": dtype_name,
                "checkpoint_dtype": config["torch_dtype"],
                "max_new_tokens": MAX_NEW_TOKENS,
                "generator": "tools/reference/make_goldens.py",
            }
            path = os.path.join(OUT_DIR, f"{name}.{dtype_name}.json")
            write_golden(path, header, cases)
            worst_inc = max(c["inc_err"] for c in cases)
            min_margin = min(min(c["greedy_margins"]) for c in cases)
            eos_hits = sum(config["eos_token_id"] in c["greedy"] for c in cases)
            print(
                f"{name:20s} {dtype_name:9s} {os.path.getsize(path) / 1024:7.1f} KiB  "
                f"incremental-vs-full rel err {worst_inc:.2e}  min greedy margin {min_margin:.4f}  "
                f"greedy with eos: {eos_hits}"
            )
            for c in cases:
                print(f"    {len(c['input_ids']):2d} tokens -> greedy {c['greedy']}")
        alt = Bf16Float32Math(config, {k: v.to(torch.bfloat16) for k, v in weights.items()},
                              torch.float32)
        errs, errs_l2, alt_b16, alt_f32 = [], [], [], []
        same_greedy = 0
        for ids, c32, c16 in zip(PROMPTS, per_dtype["float32"], per_dtype["bfloat16"]):
            l32 = torch.from_numpy(c32["logits"])
            l16 = torch.from_numpy(c16["logits"])
            errs.append(rel_err(l16, l32))
            errs_l2.append(rel_err_l2(l16, l32))
            la = alt.forward(ids)
            alt_b16.append(rel_err(la, l16))
            alt_f32.append(rel_err(la, l32))
            same_greedy += c32["greedy"] == c16["greedy"]
        summary.append((name, max(errs), max(errs_l2), max(alt_b16), max(alt_f32), same_greedy))
    print("\nRelative errors, worst position over all prompts; rel = max|a - b| / max|b| per "
          "position, l2 = ||a - b|| / ||b||.\n  bf16 vs f32: the bf16 goldens against the f32 "
          "goldens.\n  alt vs bf16 / alt vs f32: bf16 weights with f32 math (see Bf16Float32Math) "
          "against each golden.\n  greedy: prompts whose 16 greedy tokens agree in f32 and bf16.")
    for name, e, e2, ab, af, same in summary:
        print(f"  {name:20s} bf16 vs f32 rel {e:.2e} l2 {e2:.2e} | alt vs bf16 rel {ab:.2e} | "
              f"alt vs f32 rel {af:.2e} | greedy {same}/{len(PROMPTS)}")


if __name__ == "__main__":
    main(sys.argv[1:])
