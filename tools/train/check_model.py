"""Checks that train.py's module computes what Transformers' Qwen3ForCausalLM computes.

Builds a randomly initialised model with train.py's architecture, exports it as a Hugging Face
folder, loads that with Transformers (AutoModelForCausalLM, eager attention) in float32 and compares logits on a random sequence.
Run: .venv/bin/python tools/train/check_model.py --model models/NAME
"""

import argparse
import os
import sys
import tempfile

# One thread, as train.py explains.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import train  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from train_tokenizer import BpeTokenizer  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="folder with the tokenizer.json")
    args = ap.parse_args()
    torch.manual_seed(0)
    tok = BpeTokenizer(os.path.join(args.model, "tokenizer.json"))
    # A config unlike the shipped one where it matters: GQA ratio 3, 3 layers, odd context.
    ns = argparse.Namespace(hidden=96, intermediate=160, layers=3, heads=6, kv_heads=2,
                            head_dim=32, context=37, rope_theta=10000.0)
    config = train.model_config(ns, tok)
    model = train.Qwen3ForCausalLM(config)
    with torch.no_grad():  # norm weights away from 1 so a swapped norm would show
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(torch.randn_like(p) * 0.2)
    ids = torch.randint(0, config["vocab_size"], (1, 37))
    with torch.no_grad():
        ours = model(ids)[0]
    with tempfile.TemporaryDirectory() as d:
        train.export(model, config, args.model, d, {})
        hf = AutoModelForCausalLM.from_pretrained(
            d, dtype=torch.float32, attn_implementation="eager").eval()
        with torch.no_grad():
            ref = hf(ids).logits[0]
    diff = float((ours - ref).abs().max())
    scale = float(ref.abs().max())
    print(f"max |train - transformers| = {diff:.3e} (logits up to {scale:.2f})")
    sys.exit(0 if diff <= 1e-4 * max(1.0, scale) else 1)


if __name__ == "__main__":
    main()
