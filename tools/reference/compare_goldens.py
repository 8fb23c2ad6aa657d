"""Compares golden files with what Transformers computes now on the same checkpoints.

For each model and dtype: the worst relative row error (max|a - b| / max|b| per position, the
C++ tests' metric) of Transformers' logits against the golden's, and on how many prompts the 16
full-recompute greedy tokens agree. The goldens are read from the working tree, or with
--rev REV from that git revision (e.g. the goldens of an older generator).

Run: .venv/bin/python tools/reference/compare_goldens.py [--rev REV] [MODEL ...]
"""

import argparse
import json
import os
import subprocess

import torch

from make_goldens import (DTYPES, MAX_NEW_TOKENS, ROOT, TINY_MODELS, greedy_full, load,
                          prompt_logits, rel_err, setup_torch)


def read_golden(name, dtype_name, rev):
    rel = f"tests/data/goldens/{name}.{dtype_name}.json"
    if rev is None:
        with open(os.path.join(ROOT, rel)) as f:
            return json.load(f)
    text = subprocess.run(["git", "-C", ROOT, "show", f"{rev}:{rel}"], check=True,
                          capture_output=True, text=True).stdout
    return json.loads(text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rev", help="git revision to read the goldens from")
    ap.add_argument("models", nargs="*")
    args = ap.parse_args()
    setup_torch()
    for name in args.models or TINY_MODELS:
        for dtype_name, dtype in DTYPES.items():
            golden = read_golden(name, dtype_name, args.rev)
            model = load(name, dtype)
            worst, same, first_diff = 0.0, 0, []
            for case in golden["cases"]:
                ids = case["input_ids"]
                worst = max(worst, rel_err(prompt_logits(model, ids), torch.tensor(case["logits"])))
                tokens, _ = greedy_full(model, ids, MAX_NEW_TOKENS)
                if tokens == case["greedy"]:
                    same += 1
                else:
                    k = next(i for i, (a, b) in enumerate(zip(tokens, case["greedy"])) if a != b)
                    first_diff.append(f"{len(ids)} tokens: step {k}, golden margin "
                                      f"{case['greedy_margins'][k]:.4g}")
            print(f"{name:20s} {dtype_name:9s} logits rel err {worst:.2e}  greedy equal "
                  f"{same}/{len(golden['cases'])} {'; '.join(first_diff)}")


if __name__ == "__main__":
    main()
