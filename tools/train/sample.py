"""Prints samples from a saved checkpoint (for the model README), with a fixed seed.

Sampling follows the model's generation_config.json the way Transformers applies it:
temperature, then top-k, then top-p (keep the smallest set of most likely tokens whose
probability reaches top_p), then a multinomial draw; stops at any eos id or after --max-new.
Prompts given with --chat are wrapped as one user turn plus the generation prompt, as the
tokenizer_config.json chat template renders them.
The model is Transformers' (AutoModelForCausalLM); the sampling loop is this file's.
Run: .venv/bin/python tools/train/sample.py --model models/NAME "And the LORD said" --chat "Tell me a fortune."
"""

import argparse
import json
import os
import sys

# One thread, as train.py explains.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from transformers import AutoModelForCausalLM  # noqa: E402
from train_tokenizer import BpeTokenizer  # noqa: E402


def sample_next(logits, gc, gen):
    logits = logits.float() / gc["temperature"]
    kth = torch.topk(logits, min(gc["top_k"], logits.numel())).values[-1]
    logits = logits.masked_fill(logits < kth, float("-inf"))
    sorted_logits, order = torch.sort(logits, descending=False)
    cum = sorted_logits.softmax(-1).cumsum(-1)
    drop = cum <= 1 - gc["top_p"]
    drop[-1] = False
    logits[order[drop]] = float("-inf")
    return int(torch.multinomial(logits.softmax(-1), 1, generator=gen))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--chat", action="append", default=[], help="a user message")
    ap.add_argument("prompts", nargs="*")
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(
        args.model, dtype=torch.float32, attn_implementation="eager").eval()
    tok = BpeTokenizer(os.path.join(args.model, "tokenizer.json"))
    with open(os.path.join(args.model, "generation_config.json")) as f:
        gc = json.load(f)
    eos = gc["eos_token_id"] if isinstance(gc["eos_token_id"], list) else [gc["eos_token_id"]]
    gen = torch.Generator().manual_seed(args.seed)
    jobs = [(p, p) for p in args.prompts]
    jobs += [(m, f"<|im_start|>user\n{m}<|im_end|>\n<|im_start|>assistant\n") for m in args.chat]
    for shown, text in jobs:
        ids = tok.encode(text)
        out = []
        with torch.no_grad():
            step = model(torch.tensor([ids]), use_cache=True)
            logits = step.logits[0, -1]
            for _ in range(args.max_new):
                t = sample_next(logits, gc, gen)
                if t in eos:
                    break
                out.append(t)
                step = model(torch.tensor([[t]]), past_key_values=step.past_key_values,
                             use_cache=True)
                logits = step.logits[0, -1]
        kind = "chat" if text != shown else "text"
        print(f"[{kind}] {shown!r} -> {tok.decode(out)!r}", flush=True)


if __name__ == "__main__":
    main()
