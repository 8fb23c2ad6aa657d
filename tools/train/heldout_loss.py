"""Held-out loss of a saved checkpoint, computed with Transformers (AutoModelForCausalLM, float32,
eager attention).

Protocol (what the C++ test repeats with tformers):
  1. ids = tokenizer.encode(text of --text) without added special tokens; the file is the
     held-out documents each followed by <|endoftext|>, which encodes to the eos id.
  2. Split ids into consecutive non-overlapping windows of `window` tokens (default: the model's
     max_position_embeddings); the last window may be shorter and is used if it has >= 2 tokens.
  3. Each window is a fresh sequence starting at position 0; every token but the first is
     predicted from the ones before it in its window.
  4. loss = sum of -log softmax(logits)[target] over all predicted tokens / their number (nats),
     computed in float32 from the float32 checkpoint.
Writes the figure to --json (loss, tokens, predicted tokens, window, text file).
Run: .venv/bin/python tools/train/heldout_loss.py --model models/NAME
"""

import argparse
import json
import os
import sys

# One thread, as train.py explains.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from transformers import AutoModelForCausalLM  # noqa: E402
from train_tokenizer import BpeTokenizer  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--text", help="default: MODEL/heldout.txt")
    ap.add_argument("--window", type=int, default=0)
    ap.add_argument("--json", help="default: MODEL/heldout.json")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    text_path = args.text or os.path.join(args.model, "heldout.txt")
    json_path = args.json or os.path.join(args.model, "heldout.json")

    model = AutoModelForCausalLM.from_pretrained(
        args.model, dtype=torch.float32, attn_implementation="eager").eval()
    window = args.window or model.config.max_position_embeddings
    tok = BpeTokenizer(os.path.join(args.model, "tokenizer.json"))
    with open(text_path, encoding="utf-8", newline="") as f:
        ids = tok.encode(f.read())

    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(ids), window):
            chunk = ids[start:start + window]
            if len(chunk) < 2:
                continue
            logits = model(torch.tensor([chunk])).logits[0].float()
            losses = F.cross_entropy(logits[:-1], torch.tensor(chunk[1:]), reduction="none")
            total += float(losses.double().sum())
            count += len(chunk) - 1
    loss = total / count
    result = {
        "loss": round(loss, 6),
        "tokens": len(ids),
        "predicted_tokens": count,
        "window": window,
        "dtype": "float32",
        "text_file": os.path.relpath(text_path, args.model),
        "first_ids": ids[:16],
    }
    with open(json_path, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
