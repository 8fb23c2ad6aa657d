#!/usr/bin/env python3
"""Writes a Qwen3 or Qwen3-MoE checkpoint folder (config.json + model.safetensors, bf16) as one
GGUF file that llama.cpp loads, so that tools/peer/llama_cpp_bench.mjs can time llama.cpp on the very weights
that bench/bench_model times tformers on (bench/RESULTS.md, "Peer").

Only what a timing needs is written: the weights (2-D tensors byte for byte in bf16, the 1-D
norm weights widened to f32 as llama.cpp's own converter stores them), the hyperparameters, and a
placeholder BPE vocabulary of vocab_size tokens ("<t0>", "<t1>", ...) with no merges, because
llama.cpp refuses a model without one; the benchmark feeds token ids, never text.

Qwen3 needs no reordering of the q/k projections (llama.cpp runs its rope in the rotate-half
layout of the checkpoint), unlike Llama, whose checkpoints llama.cpp permutes, so only Qwen3 is
accepted, and Qwen3-MoE (llama.cpp's qwen3moe) with its experts in Transformers 5's fused tensors:
mlp.experts.gate_up_proj (experts, 2 x moe_intermediate_size, hidden) is cut into llama.cpp's
ffn_gate_exps and ffn_up_exps (each expert's first and second half of rows), down_proj is
ffn_down_exps as it is, and the router mlp.gate is ffn_gate_inp, kept in bf16 when the rest is
quantized (as llama-quantize keeps it unquantized, and tformers keeps its router as stored).

With --q8_0 or --q4_0 the 2-D tensors are written in one of llama.cpp's block formats instead
of bf16, each block 32 consecutive values of a row, as llama.cpp's reference quantizers
(ggml-quants.c) round them:
- Q8_0, the peer of tformers' --quantize int8: an f16 scale d = max|x| / 127, then 32 int8
  round(x / d), ties to even;
- Q4_0, the peer of --quantize int4: with m the value of largest magnitude (the first of equals,
  sign kept), an f16 scale d = m / -8, then 16 bytes of codes min(15, trunc(x / d + 8.5)) in
  [0, 15] (w = d (code - 8)); byte j holds value j in its low nibble and value j + 16 in its high.
Every 2-D tensor is quantized, token_embd included: the checkpoint's head is tied, so llama.cpp
multiplies by token_embd as its output layer, and tformers quantizes that head too (a copy of its
own, the embedding lookup staying bf16; one row per token, which costs no time). llama.cpp's
llama-quantize would keep a tied head in Q6_K for Q4_0; here both engines stream the same
4.5 bits per weight. Quantizing needs NumPy (Debian's python3-numpy) to round 600 M weights in
seconds; the rest is the standard library.

usage: safetensors_to_gguf.py [--q8_0 | --q4_0] CHECKPOINT_DIR OUT.gguf
"""
import json
import os
import struct
import sys

GGUF_VERSION = 3
ALIGNMENT = 32
# GGUF metadata value types and GGML tensor types (gguf.md of the ggml repository).
T_UINT32, T_FLOAT32, T_STRING, T_ARRAY = 4, 6, 8, 9
GGML_F32, GGML_Q4_0, GGML_Q8_0, GGML_BF16 = 0, 2, 8, 30
BLOCK = 32  # values per Q8_0 or Q4_0 block, each block a 2-byte f16 scale and then its codes

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
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.experts.down_proj": "ffn_down_exps.weight",
}
# Tensors that stay bf16 when the others are quantized.
UNQUANTIZED = {"ffn_gate_inp.weight"}


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
    fail(f"tensor {name!r} has no GGUF name here (only Qwen3 and Qwen3-MoE checkpoints are "
         "supported)")


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


def bf16_blocks(raw):
    """bf16 bytes (whole rows) -> f32 array of blocks of BLOCK values, one block a row."""
    import numpy as np  # only to quantize

    bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16  # bf16 is f32's high half
    return bits.view(np.float32).reshape(-1, BLOCK)


def blocks_bytes(d, codes):
    """Per-block f32 scales (n, 1) and uint8 codes (n, k) -> n blocks of f16 scale then codes."""
    import numpy as np

    return np.concatenate([d.astype("<f2").view(np.uint8), codes], axis=1).tobytes()


def q8_0(raw):
    import numpy as np

    x = bf16_blocks(raw)
    d = np.abs(x).max(axis=1, keepdims=True) / np.float32(127)
    q = np.zeros_like(x)
    np.divide(x, d, out=q, where=d > 0)
    return blocks_bytes(d, np.rint(q).astype(np.int8).view(np.uint8))


def q4_0(raw):
    import numpy as np

    x = bf16_blocks(raw)
    m = np.take_along_axis(x, np.abs(x).argmax(axis=1)[:, None], axis=1)  # first of equals
    d = m / np.float32(-8)
    inv = np.zeros_like(d)
    np.divide(np.float32(1), d, out=inv, where=d != 0)  # the unrounded d, as ggml's codes use
    # x * inv + 8.5 is never below 0 (m itself gives 0.5), so the cast truncates as ggml's does.
    q = np.minimum(15, (x * inv + np.float32(8.5)).astype(np.uint8))
    half = BLOCK // 2
    return blocks_bytes(d, q[:, :half] | q[:, half:] << 4)


# By flag: the format's name, GGML type, bytes per block, and quantizer.
QUANTS = {"--q8_0": ("Q8_0", GGML_Q8_0, 2 + BLOCK, q8_0),
          "--q4_0": ("Q4_0", GGML_Q4_0, 2 + BLOCK // 2, q4_0)}


def copy_chunk(fin, fout, ggml_type, quant, quantize, row, nbytes):
    """Writes nbytes of bf16 (whole rows of `row` values) from fin as ggml_type; returns the bytes
    written."""
    if ggml_type == GGML_F32:  # bf16 -> f32: the bf16 bits become the high half
        raw = fin.read(nbytes)
        fout.write(b"".join(b"\0\0" + raw[i:i + 2] for i in range(0, nbytes, 2)))
        return nbytes * 2
    written = 0
    step = max(1, (1 << 24) // (row * 2)) * row * 2 if ggml_type == quant else 1 << 24
    for at in range(0, nbytes, step):
        raw = fin.read(min(step, nbytes - at))
        out = quantize(raw) if ggml_type == quant else raw
        fout.write(out)
        written += len(out)
    return written


def main():
    args = sys.argv[1:]
    flags = [a for a in args if a in QUANTS]
    args = [a for a in args if a not in QUANTS]
    if len(args) != 2 or len(flags) > 1:
        sys.exit(__doc__)
    fmt, quant, block_bytes, quantize = QUANTS[flags[0]] if flags else (None, None, 0, None)
    src, dst = args
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    archs = {"qwen3": "qwen3", "qwen3_moe": "qwen3moe"}
    if cfg.get("model_type") not in archs:
        fail(f"{src}/config.json: model_type {cfg.get('model_type')!r}, only 'qwen3' and "
             "'qwen3_moe' are supported")
    st_path = os.path.join(src, "model.safetensors")
    with open(st_path, "rb") as f:
        (hlen,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(hlen))
    data_start = 8 + hlen
    header.pop("__metadata__", None)

    tensors = []  # (gguf name, ggml type, dims outermost first, [(src offset, src bytes)])

    def add(gname, shape, chunks):
        ggml_type = GGML_F32 if len(shape) == 1 else GGML_BF16
        if quant and len(shape) > 1 and gname.split(".", 2)[-1] not in UNQUANTIZED:
            ggml_type = quant
        if ggml_type == quant and shape[-1] % BLOCK:
            fail(f"{st_path}: tensor {gname} has rows of {shape[-1]} values, "
                 f"not a multiple of {BLOCK} as {fmt} needs")
        tensors.append((gname, ggml_type, shape, chunks))

    for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        if info["dtype"] != "BF16":
            fail(f"{st_path}: tensor {name} is {info['dtype']}, only BF16 checkpoints are supported")
        begin, end = info["data_offsets"]
        shape = info["shape"]
        if name.endswith(".mlp.experts.gate_up_proj"):
            # Each expert's rows: gate first, then up.
            experts, rows, hidden = shape
            half = rows // 2 * hidden * 2
            layer = gguf_name(name.replace("experts.gate_up_proj", "gate.weight")).split(".")[1]
            for i, part in enumerate(["ffn_gate_exps.weight", "ffn_up_exps.weight"]):
                add(f"blk.{layer}.{part}", [experts, rows // 2, hidden],
                    [(data_start + begin + e * 2 * half + i * half, half) for e in range(experts)])
            continue
        add(gguf_name(name), shape, [(data_start + begin, end - begin)])

    a = archs[cfg["model_type"]]
    moe = []
    if a == "qwen3moe":
        moe = [kv(f"{a}.expert_count", T_UINT32, cfg["num_experts"]),
               kv(f"{a}.expert_used_count", T_UINT32, cfg["num_experts_per_tok"]),
               kv(f"{a}.expert_feed_forward_length", T_UINT32, cfg["moe_intermediate_size"])]
    meta = moe + [
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
    for gname, ggml_type, shape, chunks in tensors:
        nbytes = sum(n for _, n in chunks)
        out_bytes = {GGML_F32: nbytes * 2, GGML_BF16: nbytes,
                     quant: nbytes // 2 // BLOCK * block_bytes}[ggml_type]
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
        for _, ggml_type, shape, chunks in tensors:
            written = 0
            for src_off, nbytes in chunks:
                fin.seek(src_off)
                written += copy_chunk(fin, fout, ggml_type, quant, quantize, shape[-1], nbytes)
            fout.write(b"\0" * (-written % ALIGNMENT))
    print(f"wrote {dst}: {len(tensors)} tensors, {os.path.getsize(dst) / 1e9:.2f} GB")


if __name__ == "__main__":
    main()
