#!/usr/bin/env python3
"""Writes a Qwen3 checkpoint folder (config.json + model.safetensors, bf16) as one GGUF file that
llama.cpp loads, so that tools/peer/llama_cpp_bench.mjs can time llama.cpp on the very weights
that bench/bench_model times tformers on (bench/RESULTS.md, "Peer").

Only what a timing needs is written: the weights (2-D tensors byte for byte in bf16, the 1-D
norm weights widened to f32 as llama.cpp's own converter stores them), the hyperparameters, and a
placeholder BPE vocabulary of vocab_size tokens ("<t0>", "<t1>", ...) with no merges, because
llama.cpp refuses a model without one; the benchmark feeds token ids, never text.

Qwen3 needs no reordering of the q/k projections (llama.cpp runs its rope in the rotate-half
layout of the checkpoint), unlike Llama, whose checkpoints llama.cpp permutes, so only Qwen3 is
accepted.

With --q8_0 the 2-D tensors are written as Q8_0 (blocks of 32 int8 with one f16 scale
max|x| / 127, llama.cpp's 8-bit format) instead of bf16, for the peer of tformers'
--quantize int8; that needs PyTorch (Debian's python3-torch) to round 600 M weights in seconds.
The rest is the standard library.

usage: safetensors_to_gguf.py [--q8_0] CHECKPOINT_DIR OUT.gguf
"""
import json
import os
import struct
import sys

GGUF_VERSION = 3
ALIGNMENT = 32
# GGUF metadata value types and GGML tensor types (gguf.md of the ggml repository).
T_UINT32, T_FLOAT32, T_STRING, T_ARRAY = 4, 6, 8, 9
GGML_F32, GGML_Q8_0, GGML_BF16 = 0, 8, 30
Q8_0_BLOCK = 32  # values per Q8_0 block: a 2-byte f16 scale, then 32 int8

LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def fail(msg):
    sys.exit(f"safetensors_to_gguf: {msg}")


def gguf_name(name):
    if name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if name == "model.norm.weight":
        return "output_norm.weight"
    if name == "lm_head.weight":
        return "output.weight"
    prefix = "model.layers."
    if name.startswith(prefix):
        layer, _, rest = name[len(prefix):].partition(".")
        if rest in LAYER_NAMES:
            return f"blk.{int(layer)}.{LAYER_NAMES[rest]}"
    fail(f"tensor {name!r} has no GGUF name here (only Qwen3 checkpoints are supported)")


def string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, value):
    out = string(key) + struct.pack("<I", vtype)
    if vtype == T_UINT32:
        return out + struct.pack("<I", value)
    if vtype == T_FLOAT32:
        return out + struct.pack("<f", value)
    if vtype == T_STRING:
        return out + string(value)
    elem, items = value  # T_ARRAY of strings
    assert elem == T_STRING
    return out + struct.pack("<IQ", T_STRING, len(items)) + b"".join(string(s) for s in items)


def q8_0(raw):
    """bf16 bytes (whole rows) -> Q8_0 bytes (ties round to even, as torch.round)."""
    import torch  # only for --q8_0

    x = torch.frombuffer(bytearray(raw), dtype=torch.bfloat16).float().reshape(-1, Q8_0_BLOCK)
    d = x.abs().amax(dim=1, keepdim=True) / 127
    q = torch.where(d > 0, torch.round(x / d.clamp_min(1e-38)), torch.zeros_like(x)).to(torch.int8)
    scale = d.half().view(torch.int16).reshape(-1, 1)
    blocks = torch.cat([scale.view(torch.int8).reshape(-1, 2), q], dim=1)
    return blocks.numpy().tobytes()


def main():
    args = sys.argv[1:]
    quant = "--q8_0" in args
    args = [a for a in args if a != "--q8_0"]
    if len(args) != 2:
        sys.exit(__doc__)
    src, dst = args
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    if cfg.get("model_type") != "qwen3":
        fail(f"{src}/config.json: model_type {cfg.get('model_type')!r}, only 'qwen3' is supported")
    st_path = os.path.join(src, "model.safetensors")
    with open(st_path, "rb") as f:
        (hlen,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(hlen))
    data_start = 8 + hlen
    header.pop("__metadata__", None)

    tensors = []  # (gguf name, ggml type, dims outermost first, src offset, src bytes)
    for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        if info["dtype"] != "BF16":
            fail(f"{st_path}: tensor {name} is {info['dtype']}, only BF16 checkpoints are supported")
        begin, end = info["data_offsets"]
        ggml_type = GGML_F32 if len(info["shape"]) == 1 else GGML_Q8_0 if quant else GGML_BF16
        if ggml_type == GGML_Q8_0 and info["shape"][-1] % Q8_0_BLOCK:
            fail(f"{st_path}: tensor {name} has rows of {info['shape'][-1]} values, "
                 f"not a multiple of {Q8_0_BLOCK} as Q8_0 needs")
        tensors.append((gguf_name(name), ggml_type, info["shape"], data_start + begin, end - begin))

    a = "qwen3"
    meta = [
        kv("general.architecture", T_STRING, a),
        kv("general.name", T_STRING, os.path.basename(os.path.normpath(src))),
        kv(f"{a}.block_count", T_UINT32, cfg["num_hidden_layers"]),
        kv(f"{a}.context_length", T_UINT32, cfg["max_position_embeddings"]),
        kv(f"{a}.embedding_length", T_UINT32, cfg["hidden_size"]),
        kv(f"{a}.feed_forward_length", T_UINT32, cfg["intermediate_size"]),
        kv(f"{a}.attention.head_count", T_UINT32, cfg["num_attention_heads"]),
        kv(f"{a}.attention.head_count_kv", T_UINT32, cfg["num_key_value_heads"]),
        kv(f"{a}.attention.key_length", T_UINT32, cfg["head_dim"]),
        kv(f"{a}.attention.value_length", T_UINT32, cfg["head_dim"]),
        kv(f"{a}.rope.freq_base", T_FLOAT32, float(cfg["rope_theta"])),
        kv(f"{a}.attention.layer_norm_rms_epsilon", T_FLOAT32, float(cfg["rms_norm_eps"])),
        kv("tokenizer.ggml.model", T_STRING, "gpt2"),
        kv("tokenizer.ggml.pre", T_STRING, "qwen2"),
        kv("tokenizer.ggml.tokens", T_ARRAY, (T_STRING, [f"<t{i}>" for i in range(cfg["vocab_size"])])),
        kv("tokenizer.ggml.merges", T_ARRAY, (T_STRING, [])),
    ]

    infos, offset = [], 0
    for gname, ggml_type, shape, _, nbytes in tensors:
        out_bytes = {GGML_F32: nbytes * 2, GGML_BF16: nbytes,
                     GGML_Q8_0: nbytes // 2 // Q8_0_BLOCK * (2 + Q8_0_BLOCK)}[ggml_type]
        dims = list(reversed(shape))  # GGUF lists the innermost dimension first
        infos.append(string(gname) + struct.pack("<I", len(dims)) +
                     b"".join(struct.pack("<Q", d) for d in dims) +
                     struct.pack("<IQ", ggml_type, offset))
        offset += (out_bytes + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT

    head = b"GGUF" + struct.pack("<IQQ", GGUF_VERSION, len(tensors), len(meta))
    head += b"".join(meta) + b"".join(infos)
    head += b"\0" * (-len(head) % ALIGNMENT)
    with open(st_path, "rb") as fin, open(dst, "wb") as fout:
        fout.write(head)
        for _, ggml_type, shape, src_off, nbytes in tensors:
            fin.seek(src_off)
            if ggml_type == GGML_F32:  # bf16 -> f32: the bf16 bits become the high half
                raw = fin.read(nbytes)
                fout.write(b"".join(b"\0\0" + raw[i:i + 2] for i in range(0, nbytes, 2)))
                written = nbytes * 2
            elif ggml_type == GGML_Q8_0:
                written = 0
                rows_per_chunk = max(1, (1 << 24) // (shape[-1] * 2))
                for r in range(0, shape[0], rows_per_chunk):
                    n = min(rows_per_chunk, shape[0] - r) * shape[-1] * 2
                    out = q8_0(fin.read(n))
                    fout.write(out)
                    written += len(out)
            else:
                left = nbytes
                while left:
                    chunk = fin.read(min(left, 1 << 24))
                    fout.write(chunk)
                    left -= len(chunk)
                written = nbytes
            fout.write(b"\0" * (-written % ALIGNMENT))
    print(f"wrote {dst}: {len(tensors)} tensors, {os.path.getsize(dst) / 1e9:.2f} GB")


if __name__ == "__main__":
    main()
