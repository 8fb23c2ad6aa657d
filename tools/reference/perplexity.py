"""Perplexity goldens for `tformers perplexity`, from Transformers in float32.

The windows are those of `tformers perplexity` (apps/perplexity.cc) and of the shipped model's
held-out loss (tools/train/heldout_loss.py):
  1. ids = the text encoded without added special tokens;
  2. consecutive, non-overlapping windows of `ctx` ids; the last may be shorter and is used when
     it has at least 2 ids;
  3. each window is a fresh sequence from position 0; every id but its first is scored:
     -log_softmax(logits)[id], computed in float64 from the float32 logits;
  4. nll = the mean over the scored ids; perplexity = exp(nll); the standard error of nll is
     sqrt((mean(nll^2) - nll^2) / (n - 1)) over the n scored ids, and that of the perplexity
     perplexity * it (llama-perplexity's estimate).
The text is encoded with tools/train/train_tokenizer.py's BpeTokenizer, which check_tokenizer.py
checks against the Rust `tokenizers` library, so this covers byte-level BPE tokenizers of that
kind (the shipped model's).

The model is AutoModelForCausalLM.from_pretrained(MODEL, dtype=float32,
attn_implementation="eager") of Transformers 5.23.0 on CPU.

Self-check: with ctx 256 on the shipped model's heldout.txt this is heldout.json's protocol, and
the nll must equal its "loss" to 2e-6 (heldout_loss.py takes float32 cross-entropies, and
heldout.json rounds to 6 decimals).

Run: .venv/bin/python tools/reference/perplexity.py
(writes tests/data/goldens/perplexity.kjv-fortunes-tiny.float32.json; --ctx, --text, --model
and --out for other cases, --out - to print only)
"""

import argparse
import json
import math
import os
import sys

# One thread: on the shared 2-core machines two threads spin on each other (tools/train/README.md).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tools", "train"))
from transformers import AutoModelForCausalLM  # noqa: E402

from make_goldens import check_versions, prompt_logits  # noqa: E402
from train_tokenizer import BpeTokenizer  # noqa: E402

DEFAULT_MODEL = "models/kjv-fortunes-tiny"
# 256: the held-out protocol (the model's positions), a last window of 198 ids; 27: 38,854 =
# 1,439 x 27 + 1, so the last window has one id and is dropped.
DEFAULT_CTX = [256, 27]


def perplexity(model, ids, ctx):
    total, total_sq, scored, windows = 0.0, 0.0, 0, 0
    with torch.no_grad():
        for start in range(0, len(ids), ctx):
            window = ids[start:start + ctx]
            if len(window) < 2:
                continue
            logits = prompt_logits(model, window)
            logp = torch.log_softmax(logits[:-1].double(), dim=-1)
            nll = -logp.gather(1, torch.tensor(window[1:])[:, None])[:, 0]
            total += float(nll.sum())
            total_sq += float((nll * nll).sum())
            scored += len(window) - 1
            windows += 1
    nll = total / scored
    var = total_sq / scored - nll * nll
    se = math.sqrt(var / (scored - 1)) if scored > 1 and var > 0 else 0.0
    ppl = math.exp(nll)
    return {"ctx": ctx, "tokens": len(ids), "windows": windows, "scored_tokens": scored,
            "nll": nll, "nll_stderr": se, "perplexity": ppl, "perplexity_stderr": ppl * se}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--text", help="default: MODEL/heldout.txt")
    ap.add_argument("--ctx", type=int, nargs="+", default=DEFAULT_CTX)
    ap.add_argument("--out", help="default: tests/data/goldens/perplexity.<model>.float32.json")
    args = ap.parse_args()
    check_versions()
    torch.set_num_threads(1)
    model_dir = os.path.join(ROOT, args.model)
    text_path = os.path.join(ROOT, args.text) if args.text else os.path.join(model_dir,
                                                                             "heldout.txt")
    out = args.out or os.path.join(ROOT, "tests", "data", "goldens",
                                   f"perplexity.{os.path.basename(model_dir)}.float32.json")

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    tok = BpeTokenizer(os.path.join(model_dir, "tokenizer.json"))
    with open(text_path, encoding="utf-8", newline="") as f:
        ids = tok.encode(f.read())

    cases = []
    for ctx in args.ctx:
        assert 2 <= ctx <= model.config.max_position_embeddings, ctx
        case = perplexity(model, ids, ctx)
        print(json.dumps(case), flush=True)
        cases.append(case)

    heldout = os.path.join(model_dir, "heldout.json")
    if os.path.exists(heldout) and os.path.samefile(text_path,
                                                    os.path.join(model_dir, "heldout.txt")):
        want = json.load(open(heldout))
        for case in cases:
            if case["ctx"] == want["window"]:
                assert case["tokens"] == want["tokens"], (case["tokens"], want["tokens"])
                assert case["scored_tokens"] == want["predicted_tokens"]
                # heldout.json rounds to 6 decimals a loss summed from float32 cross-entropies.
                assert abs(case["nll"] - want["loss"]) <= 2e-6, (case["nll"], want["loss"])
                print(f"self-check: nll {case['nll']:.7f} is heldout.json's loss {want['loss']}")

    if out == "-":
        return
    golden = {
        "generator": "tools/reference/perplexity.py (transformers 5.23.0, torch 2.15.0)",
        "model": args.model,
        "text": os.path.relpath(text_path, ROOT),
        "dtype": "float32",
        "first_ids": ids[:16],
        "cases": cases,
    }
    with open(out, "w") as f:
        json.dump(golden, f, indent=2)
        f.write("\n")
    print(f"wrote {os.path.relpath(out, ROOT)}")


if __name__ == "__main__":
    main()
