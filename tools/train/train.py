"""Trains the default model: a small Qwen3ForCausalLM in float32 on CPU with Debian's PyTorch.

The module computes what Transformers' modeling_qwen3.py computes (eager attention), in the
conventions of Transformers' modeling_qwen3.py: RMSNorm in float32 times weight; q_norm / k_norm
per head before rotate-half RoPE (inv_freq = theta^(-2i/d)); GQA by repeating KV heads; scores
scaled by head_dim^-0.5 with an additive causal mask of finfo.min; softmax in float32; SiLU-gated
MLP; the lm_head tied to embed_tokens. check_model.py and heldout_loss.py load the saved
checkpoint with Transformers itself, so any mismatch would show there.

Data: each training document's ids followed by <|endoftext|>, concatenated in a fixed shuffled
order into one stream; a batch is `batch` random windows of `context + 1` tokens.
Optimiser: AdamW (betas 0.9/0.95, weight decay on matrices), linear warmup then cosine decay to
10 % of the peak. The schedule runs either over --steps, or over --minutes of wall time (progress
= elapsed / budget; the number of steps taken is logged and written to train_log.json so the
run can be repeated with --steps).

Run (see models/NAME/README.md for the exact command used):
  nice -n 10 .venv/bin/python tools/train/train.py --corpus build/corpus \
      --model models/NAME --work build/train --minutes 60
"""

import argparse
import json
import math
import os
import random
import sys
import time

# One thread, and OpenBLAS without its own pool: on the shared, oversubscribed 2-core machine a
# single thread did a training step with 1/4 of the CPU time of two (spinning threads waiting
# for each other) and in 1/3 of the wall time. Set before torch loads OpenBLAS.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))
from safetensors_io import write_safetensors  # noqa: E402
from train_tokenizer import BpeTokenizer, read_documents  # noqa: E402

TRANSFORMERS_VERSION = "4.51.3"


def model_config(args, tokenizer):
    eos = tokenizer.special["<|endoftext|>"]
    config = dict(
        architectures=["Qwen3ForCausalLM"],
        model_type="qwen3",
        vocab_size=len(tokenizer.vocab) + len(tokenizer.special),
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        hidden_act="silu",
        max_position_embeddings=args.context,
        rms_norm_eps=1e-6,
        rope_theta=args.rope_theta,
        rope_scaling=None,
        attention_bias=False,
        attention_dropout=0.0,
        initializer_range=0.02,
        tie_word_embeddings=True,
        use_cache=True,
        use_sliding_window=False,
        sliding_window=None,
        max_window_layers=args.layers,
        bos_token_id=eos,
        eos_token_id=eos,
        torch_dtype="float32",
        transformers_version=TRANSFORMERS_VERSION,
    )
    return dict(sorted(config.items()))


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, d = c["hidden_size"], c["head_dim"]
        self.nh, self.nkv, self.d = c["num_attention_heads"], c["num_key_value_heads"], d
        self.q_proj = nn.Linear(h, self.nh * d, bias=False)
        self.k_proj = nn.Linear(h, self.nkv * d, bias=False)
        self.v_proj = nn.Linear(h, self.nkv * d, bias=False)
        self.o_proj = nn.Linear(self.nh * d, h, bias=False)
        self.q_norm = RMSNorm(d, c["rms_norm_eps"])
        self.k_norm = RMSNorm(d, c["rms_norm_eps"])

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, t, self.nh, self.d)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, t, self.nkv, self.d)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.nkv, self.d).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin  # cos, sin [T, D] broadcast over [B, H]
        k = k * cos + rotate_half(k) * sin
        rep = self.nh // self.nkv
        k = k.repeat_interleave(rep, dim=1)  # head j uses KV head j // rep, as repeat_kv
        v = v.repeat_interleave(rep, dim=1)
        scores = torch.matmul(q, k.transpose(2, 3)) * self.d**-0.5 + mask
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(b, t, -1)
        return self.o_proj(out)


class Mlp(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, i = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.mlp = Mlp(c)

    def forward(self, h, cos, sin, mask):
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class Qwen3Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(Layer(c) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])


class Qwen3ForCausalLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.config = c
        self.model = Qwen3Model(c)
        d = c["head_dim"]
        inv_freq = 1.0 / (c["rope_theta"]**(torch.arange(0, d, 2, dtype=torch.int64).float() / d))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.reset_parameters()

    def reset_parameters(self):
        std = self.config["initializer_range"]
        # Residual-branch outputs start smaller so the stream's scale does not grow with depth.
        out_std = std / math.sqrt(2 * self.config["num_hidden_layers"])
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(p)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                nn.init.normal_(p, std=out_std)
            else:
                nn.init.normal_(p, std=std)

    def forward(self, ids):
        """ids [B, T] -> logits [B, T, V]."""
        t = ids.shape[1]
        pos = torch.arange(t, dtype=torch.float32)
        freqs = torch.outer(pos, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        mask = torch.full((t, t), torch.finfo(torch.float32).min).triu(1)
        h = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            h = layer(h, cos, sin, mask)
        h = self.model.norm(h)
        return F.linear(h, self.model.embed_tokens.weight)


def hf_state_dict(model):
    """Parameter name -> tensor under Transformers' names (no lm_head: it is tied)."""
    return {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()
            if k != "inv_freq"}


def export(model, config, tokenizer_dir, out_dir, generation_config):
    os.makedirs(out_dir, exist_ok=True)
    write_safetensors(os.path.join(out_dir, "model.safetensors"), hf_state_dict(model),
                      {"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump(generation_config, f, indent=2)
        f.write("\n")


def generation_config(args, tok):
    eos = tok.special["<|endoftext|>"]
    return {
        "bos_token_id": eos,
        "do_sample": True,
        "eos_token_id": [tok.special["<|im_end|>"], eos],
        "max_length": args.context,
        "pad_token_id": eos,
        "temperature": 0.8,
        "top_k": 40,
        "top_p": 0.95,
        "transformers_version": TRANSFORMERS_VERSION,
    }


def lr_at(progress, args):
    warm = args.warmup_fraction
    if progress < warm:
        return args.lr * progress / warm
    p = min(1.0, (progress - warm) / (1 - warm))
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", default="build/corpus")
    ap.add_argument("--model", required=True, help="model folder holding tokenizer.json")
    ap.add_argument("--work", default="build/train", help="checkpoints and log")
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--steps", type=int, default=0, help="fixed step count instead of minutes")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--intermediate", type=int, default=768)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup-fraction", type=float, default=0.03)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--checkpoint-minutes", type=float, default=5.0)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--benchmark", type=int, default=0, help="time N steps and exit")
    ap.add_argument("--export-to", help="only export the saved checkpoint (with --resume's "
                    "file) to this folder, e.g. to look at a run in progress")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    os.makedirs(args.work, exist_ok=True)
    tok = BpeTokenizer(os.path.join(args.model, "tokenizer.json"))
    eos = tok.special["<|endoftext|>"]
    config = model_config(args, tok)

    docs = read_documents(os.path.join(args.corpus, "train.jsonl"))
    random.Random(args.seed).shuffle(docs)
    stream = []
    for d in docs:
        stream.extend(tok.encode(d))
        stream.append(eos)
    data = torch.tensor(stream, dtype=torch.int64)
    print(f"train stream: {len(docs)} documents, {len(stream)} tokens", flush=True)

    model = Qwen3ForCausalLM(config)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"parameters: {n_params} ({config})", flush=True)
    decay = [p for n, p in model.named_parameters() if p.dim() == 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    gen = torch.Generator().manual_seed(args.seed)

    step, elapsed, log = 0, 0.0, []
    ckpt_path = os.path.join(args.work, "checkpoint.pt")
    if args.resume and os.path.exists(ckpt_path):
        ck = torch.load(ckpt_path)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        gen.set_state(ck["gen"])
        step, elapsed, log = ck["step"], ck["elapsed"], ck["log"]
        print(f"resumed at step {step}, {elapsed:.0f} s", flush=True)
    if args.export_to:
        model.load_state_dict(torch.load(ckpt_path)["model"])
        export(model, config, args.model, args.export_to, generation_config(args, tok))
        return

    def save():
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "gen": gen.get_state(),
                    "step": step, "elapsed": elapsed, "log": log, "args": vars(args)},
                   ckpt_path + ".tmp")
        os.replace(ckpt_path + ".tmp", ckpt_path)

    budget = args.minutes * 60
    t_last = time.time()
    last_save = elapsed
    smooth = None
    model.train()
    while True:
        progress = step / args.steps if args.steps else elapsed / budget
        if progress >= 1.0 or (args.benchmark and step >= args.benchmark):
            break
        lr = lr_at(progress, args)
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, len(data) - args.context - 1, (args.batch,), generator=gen)
        batch = torch.stack([data[s:s + args.context + 1] for s in starts.tolist()])
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
        opt.step()
        step += 1
        now = time.time()
        elapsed += now - t_last
        t_last = now
        value = float(loss)
        smooth = value if smooth is None else 0.98 * smooth + 0.02 * value
        if step % 10 == 0 or step == 1:
            log.append({"step": step, "seconds": round(elapsed, 1), "lr": lr, "loss": value,
                        "smoothed": smooth, "grad_norm": gnorm})
            print(f"step {step} {elapsed:.0f}s lr {lr:.2e} loss {value:.4f} "
                  f"smoothed {smooth:.4f} gnorm {gnorm:.2f} "
                  f"{step * args.batch * args.context / elapsed:.0f} tok/s", flush=True)
        if elapsed - last_save > args.checkpoint_minutes * 60:
            save()
            last_save = elapsed
    if args.benchmark:
        print(f"{elapsed / step:.3f} s/step", flush=True)
        return
    save()

    export(model, config, args.model, args.model, generation_config(args, tok))
    tokens_seen = step * args.batch * args.context
    summary = {
        "steps": step,
        "seconds": round(elapsed, 1),
        "tokens_seen": tokens_seen,
        "epochs": round(tokens_seen / len(stream), 3),
        "train_stream_tokens": len(stream),
        "parameters": n_params,
        "final_smoothed_train_loss": smooth,
        "args": vars(args),
        "log": log,
    }
    with open(os.path.join(args.work, "train_log.json"), "w") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")
    print(f"done: {step} steps in {elapsed:.0f} s; exported to {args.model}", flush=True)


if __name__ == "__main__":
    main()
