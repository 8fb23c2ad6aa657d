#!/usr/bin/env python3
"""Writes a Qwen3, Qwen3-MoE, Qwen3.5, gpt-oss or Gemma 4 checkpoint folder (config.json +
model.safetensors) as one GGUF file that llama.cpp loads, so that tools/peer/llama_cpp_bench.mjs
can time llama.cpp on the very weights that bench/bench_model and `tformers bench` time tformers on
(bench/RESULTS.md, "Peer").

Only what a timing needs is written: the weights, the hyperparameters, and a placeholder BPE
vocabulary of vocab_size tokens ("<t0>", "<t1>", ...) with no merges, because llama.cpp refuses a
model without one; the benchmark feeds token ids, never text.

Qwen3 and Qwen3-MoE (bf16 checkpoints): the 2-D tensors are written byte for byte in bf16, the
1-D norm weights widened to f32 as llama.cpp's own converter stores them. Qwen3 needs no
reordering of the q/k projections (llama.cpp runs its rope in the rotate-half layout of the
checkpoint), unlike Llama, whose checkpoints llama.cpp permutes, so only Qwen3 is accepted, and
Qwen3-MoE (llama.cpp's qwen3moe) with its experts in Transformers 5's fused tensors:
mlp.experts.gate_up_proj (experts, 2 x moe_intermediate_size, hidden) is cut into llama.cpp's
ffn_gate_exps and ffn_up_exps (each expert's first and second half of rows), down_proj is
ffn_down_exps as it is, and the router mlp.gate is ffn_gate_inp, kept in bf16 when the rest is
quantized (as llama-quantize keeps it unquantized, and tformers keeps its router as stored).

gpt-oss (model_type gpt_oss, llama.cpp's "gpt-oss"; needs NumPy): the released layout, which
bench/make_shape's gpt-oss-20b-2l copies (bf16 attention and router, MXFP4 experts), and the float
layout Transformers saves (every tensor f32 or bf16). Attention weights, the embedding and the
router stay in their stored type (bf16, f16 or f32); the norms, the attention biases, the sinks
and every bias of the router and the experts are written in f32, as llama.cpp's converter does.
The experts:
- MXFP4 (mlp.experts.*_blocks (experts, rows, in / 32, 16) uint8 and *_scales (experts, rows,
  in / 32) uint8, as the checkpoints ship them) are written in GGML's MXFP4 as they are, without
  a round trip through floats: each block of 32 values is ggml's block_mxfp4, the scale byte
  (E8M0, 2^(s - 127), the same byte in both) and then 16 bytes of codes. The two layouts order
  the 4-bit codes differently: the checkpoint's byte j holds value 2j in its low nibble and
  2j + 1 in its high one, ggml's byte j holds value j low and value j + 16 high, so the codes are
  unpacked and packed again (as llama.cpp's GptOssModel.repack_mxfp4 does);
- float (Transformers' (experts, in, out) tensors) are transposed to ggml's (experts, out, in)
  rows and written in the stored type.
The checkpoints interleave the gate and up projections of gate_up_proj (even rows gate, odd rows
up; the same for gate_up_proj_bias), which become ffn_gate_exps and ffn_up_exps (and their .bias);
down_proj is ffn_down_exps. A tied head (tie_word_embeddings, no lm_head.weight) is written again
as output.weight, which llama.cpp's gpt-oss requires.
The hyperparameters are the ones LLM_ARCH_OPENAI_MOE reads: expert counts and
expert_feed_forward_length, attention.sliding_window (and sliding_window_pattern when layer_types
is not gpt-oss's alternation, sliding on even layers), the YaRN keys (rope.scaling.type, factor,
original_context_length; without rope_scaling or rope_parameters in config.json, gpt-oss's
default, factor 32 of 4096 positions, as Transformers' GptOssConfig and tformers take it). llama.cpp
fixes some of gpt-oss's computation where Transformers reads it from config.json: the clamped
SwiGLU's alpha 1.702 and limit 7.0, YaRN's beta_fast 32 and beta_slow 1, and YaRN's correction
range rounded to whole dimensions (Transformers' truncate: true; gpt-oss's configs say false, so
llama.cpp's frequencies of a few dimensions in the ramp differ from Transformers' and tformers').
Values other than llama.cpp's are reported on stderr and written as llama.cpp computes them.

Qwen3.5 (model_type qwen3_5_text, Qwen3_5ForCausalLM; llama.cpp's qwen35; needs NumPy), the
dense hybrid of Gated DeltaNet and gated attention, laid out as llama.cpp's own converter lays it
out (convert_hf_to_gguf.py: Qwen3_5TextModel over _LinearAttentionVReorderBase and
Qwen3NextModel, conversion/qwen.py in the llama.cpp that node-llama-cpp 3.21.1 bundles). The
matrices stay in their stored type, the rest is written in f32:
- the (1 + w) RMSNorms (input_layernorm, post_attention_layernorm, q_norm, k_norm, model.norm)
  are stored as 1 + w (llama.cpp multiplies by the weight as it is); the DeltaNet's gated norm
  linear_attn.norm multiplies by w itself and is stored as it is (ssm_norm);
- A_log becomes ssm_a = -exp(A_log), dt_bias ssm_dt.bias, conv1d.weight (channels, 1, kernel)
  ssm_conv1d (channels, kernel), in f32 as the converter forces it;
- in_proj_qkv is attn_qkv, in_proj_z attn_gate, in_proj_b ssm_beta, in_proj_a ssm_alpha,
  out_proj ssm_out, post_attention_layernorm post_attention_norm;
- with fewer key heads than value heads, the value heads are reordered from the checkpoint's
  grouped order (the r value heads of key head 0, then of key head 1, ...) to ggml's tiled one
  (value head j of every key head in turn: new head j * key_heads + g is old head g * r + j), so
  that ggml_repeat broadcasts the key heads: the V rows of in_proj_qkv and their conv1d channels,
  the rows of in_proj_z, in_proj_b and in_proj_a, A_log and dt_bias, and the columns of out_proj;
- the attention's q_proj, each head's query then its gate, is attn_q as it is (llama.cpp splits
  it per head); the tied head is token_embd alone (llama.cpp's qwen35 falls back to it).
The hyperparameters are those of Qwen3NextModel.set_gguf_parameters (ssm.conv_kernel,
ssm.state_size, ssm.group_count, ssm.time_step_rank, ssm.inner_size, full_attention_interval,
rope.dimension_count of head_dim x partial_rotary_factor) and rope.dimension_sections, Qwen3.5's
interleaved MRoPE sections, [11, 11, 10, 0] when config.json has no mrope_section (text positions
are equal in every section, so this is the plain rotary of the first 64 of 256 dimensions).

Gemma 4's text model (model_type gemma4_text, Gemma4ForCausalLM as Transformers 5.23 writes it;
llama.cpp's gemma4; needs NumPy), dense or with enable_moe_block's experts beside each MLP, laid
out as llama.cpp's own converter lays it out (convert_hf_to_gguf.py: Gemma4Model,
conversion/gemma.py in the llama.cpp that node-llama-cpp 3.21.1 bundles). The matrices stay in
their stored type (or --q8_0 / --q4_0, per_layer_token_embd and the experts included, the router
excepted), the rest is written in f32:
- the RMSNorms multiply by w itself (unlike Gemma 3's 1 + w) and are stored as they are (v_norm
  has no weight); layer_scalar is layer_output_scale, router.scale ffn_gate_inp.scale (llama.cpp
  multiplies the router's normed input by it and by 1 / sqrt(hidden_size) as Transformers does),
  router.per_expert_scale ffn_down_exps.scale (each chosen expert's output times its scale, which
  is Transformers' scaling of that expert's weight);
- experts.gate_up_proj (experts, 2 x moe_intermediate_size, hidden), each expert's gate rows then
  its up rows, is ffn_gate_up_exps as it is (llama.cpp takes the fused tensor's first half as the
  gate), experts.down_proj ffn_down_exps; router.proj is ffn_gate_inp;
- the per-layer inputs: embed_tokens_per_layer (vocab, layers x hidden_size_per_layer_input) is
  per_layer_token_embd, per_layer_model_projection per_layer_model_proj,
  per_layer_projection_norm per_layer_proj_norm, and in each layer per_layer_input_gate inp_gate,
  per_layer_projection proj, post_per_layer_input_norm post_norm;
- pre_feedforward_layernorm is ffn_norm, post_feedforward_layernorm post_ffw_norm (and _1, _2
  with the experts), pre_feedforward_layernorm_2 pre_ffw_norm_2;
- a tied head is token_embd alone (an lm_head.weight beside it is dropped, as Transformers ties
  it); KV-shared layers have no k/v weights, full layers with attention_k_eq_v no v_proj (llama.cpp
  then takes the keys' projection as values, as Transformers does);
- rope_freqs (head_dim / 2 values of the full layers) is generated: the full layers' proportional
  RoPE rotates the first partial_rotary_factor x head_dim / 2 frequency pairs with the periods of
  the whole head, theta^(2i / head_dim), and leaves the rest as it is; ggml's rope computes that
  with rope.dimension_count = head_dim and rope_freqs 1 for the rotated pairs and 1e30 (no
  rotation) for the others. (Gemma 4's default RoPE, that of the sliding layers, rotates the whole
  head.)
The hyperparameters are those of Gemma4Model.set_gguf_parameters: key_length, value_length and
rope.dimension_count of the full layers and their *_swa of the sliding ones, attention.head_count_kv
(an array where full and sliding layers differ), sliding_window and sliding_window_pattern (one
bool a layer), rope.freq_base (full) and rope.freq_base_swa, attention.shared_kv_layers,
embedding_length_per_layer_input (0 without per-layer inputs), feed_forward_length (an array with
use_double_wide_mlp: twice intermediate_size in the KV-shared layers), the expert counts and
expert_feed_forward_length with enable_moe_block. final_logit_softcapping is written as 0 when
config.json has none, because llama.cpp caps at 30 without the key (llama.cpp's converter leaves it
out). The full layers' head size and KV heads are read as Gemma4TextConfig resolves them: from
per_layer_config (Transformers 5.23), or from global_head_dim (512 when absent) and
num_global_key_value_heads (only with attention_k_eq_v) as the released configs say.
A layout llama.cpp computes differently is refused: its gemma4 gives each KV-shared layer the
keys and values of the last unshared layer if full and of the one before if sliding, where
Transformers takes the last unshared layer of the same type, so the last unshared layer must be
full and the one before it sliding (true of the released E2B and E4B, not of every config: the
unshared layers of tests/data/models/hf-gemma4 end full, sliding, and llama.cpp aborts on it,
GGML_ASSERT(map_layer_ids.find(il_reuse) != ...) in llama-kv-cache.cpp).
llama.cpp's CPU GELU reads a table of f16 values at the input rounded to f16 (GGML_GELU_FP16), so
its log-probabilities differ from Transformers' float32 ones by 1e-3 to 1e-2 on small random
checkpoints (Transformers with that GELU comes within 1e-5 until one rounding falls the other way).

With --q8_0 or --q4_0 the 2-D float tensors are written in one of llama.cpp's block formats
instead, each block 32 consecutive values of a row, as llama.cpp's reference quantizers
(ggml-quants.c) round them (MXFP4 experts stay MXFP4, routers stay as stored):
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
seconds; the Qwen3 checkpoints in bf16 need only the standard library.

usage: safetensors_to_gguf.py [--q8_0 | --q4_0] CHECKPOINT_DIR OUT.gguf
"""
import json
import math
import os
import struct
import sys

GGUF_VERSION = 3
ALIGNMENT = 32
# GGUF metadata value types and GGML tensor types (gguf.md of the ggml repository).
T_UINT32, T_INT32, T_FLOAT32, T_BOOL, T_STRING, T_ARRAY = 4, 5, 6, 7, 8, 9
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q8_0, GGML_BF16, GGML_MXFP4 = 0, 1, 2, 8, 30, 39
BLOCK = 32  # values per Q8_0, Q4_0 or MXFP4 block
# Bytes per block of 32 values, by GGML type: a 2-byte f16 scale then the codes (Q8_0, Q4_0),
# a 1-byte E8M0 scale then 16 bytes of 4-bit codes (MXFP4).
BLOCK_BYTES = {GGML_Q8_0: 2 + BLOCK, GGML_Q4_0: 2 + BLOCK // 2, GGML_MXFP4: 1 + BLOCK // 2}
VALUE_BYTES = {GGML_F32: 4, GGML_F16: 2, GGML_BF16: 2}

# The attention block and the MLP, as every family here names them.
ATTENTION_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
}
MLP_NAMES = {
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
QWEN_LAYER_NAMES = {
    **ATTENTION_NAMES,
    **MLP_NAMES,
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.experts.down_proj": "ffn_down_exps.weight",
}
# gpt-oss's tensors that are renamed only (the experts' are cut or repacked in gpt_oss_tensors).
GPT_OSS_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.bias": "attn_output.bias",
    "self_attn.sinks": "attn_sinks.weight",
    "mlp.router.weight": "ffn_gate_inp.weight",
    "mlp.router.bias": "ffn_gate_inp.bias",
    "mlp.experts.down_proj_bias": "ffn_down_exps.bias",
}
# Qwen3.5's tensors by their names in a layer (the transforms are in qwen35_tensors).
QWEN35_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",  # per head: query, then gate
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "linear_attn.in_proj_qkv.weight": "attn_qkv.weight",
    "linear_attn.in_proj_z.weight": "attn_gate.weight",
    "linear_attn.in_proj_b.weight": "ssm_beta.weight",
    "linear_attn.in_proj_a.weight": "ssm_alpha.weight",
    "linear_attn.conv1d.weight": "ssm_conv1d.weight",
    "linear_attn.dt_bias": "ssm_dt.bias",
    "linear_attn.A_log": "ssm_a",
    "linear_attn.norm.weight": "ssm_norm.weight",
    "linear_attn.out_proj.weight": "ssm_out.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
# Qwen3.5's RMSNorms that scale by 1 + w (all but the DeltaNet's gated linear_attn.norm).
QWEN35_PLUS_ONE = {"model.norm.weight", "input_layernorm.weight",
                   "post_attention_layernorm.weight", "self_attn.q_norm.weight",
                   "self_attn.k_norm.weight"}
# Gemma 4's tensors in a layer by their GGUF names in llama.cpp's gemma4 (gguf-py's
# tensor_mapping.py; what is transformed, in gemma4_tensors).
GEMMA4_LAYER_NAMES = {
    **ATTENTION_NAMES,
    **MLP_NAMES,
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    "layer_scalar": "layer_output_scale.weight",
    # enable_moe_block: the experts beside the MLP, with norms of their own
    "pre_feedforward_layernorm_2.weight": "pre_ffw_norm_2.weight",
    "post_feedforward_layernorm_1.weight": "post_ffw_norm_1.weight",
    "post_feedforward_layernorm_2.weight": "post_ffw_norm_2.weight",
    "router.proj.weight": "ffn_gate_inp.weight",
    "router.scale": "ffn_gate_inp.scale",
    "router.per_expert_scale": "ffn_down_exps.scale",
    "experts.gate_up_proj": "ffn_gate_up_exps.weight",
    "experts.down_proj": "ffn_down_exps.weight",
    # per-layer inputs (hidden_size_per_layer_input > 0)
    "per_layer_input_gate.weight": "inp_gate.weight",
    "per_layer_projection.weight": "proj.weight",
    "post_per_layer_input_norm.weight": "post_norm.weight",
}
GEMMA4_MODEL_NAMES = {
    "model.embed_tokens_per_layer.weight": "per_layer_token_embd.weight",
    "model.per_layer_model_projection.weight": "per_layer_model_proj.weight",
    "model.per_layer_projection_norm.weight": "per_layer_proj_norm.weight",
}
# Tensors that stay as stored when the others are quantized.
UNQUANTIZED = {"ffn_gate_inp.weight"}
# NumPy's dtype of each safetensors dtype read here (bf16 as its bits).
NP_DTYPES = {"BF16": "<u2", "F16": "<f2", "F32": "<f4", "U8": "u1"}
STORED_TYPES = {"BF16": GGML_BF16, "F16": GGML_F16, "F32": GGML_F32}


def fail(msg):
    sys.exit(f"safetensors_to_gguf: {msg}")


def warn(msg):
    print(f"safetensors_to_gguf: note: {msg}", file=sys.stderr)


def gguf_name(name, layer_names):
    if name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if name == "model.norm.weight":
        return "output_norm.weight"
    if name == "lm_head.weight":
        return "output.weight"
    prefix = "model.layers."
    if name.startswith(prefix):
        layer, _, rest = name[len(prefix):].partition(".")
        if rest in layer_names:
            return f"blk.{int(layer)}.{layer_names[rest]}"
    fail(f"tensor {name!r} has no GGUF name here (only Qwen3, Qwen3-MoE, Qwen3.5, gpt-oss and "
         "Gemma 4 checkpoints are supported)")


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
    elem, items = value  # T_ARRAY of strings, int32 or bools
    if elem == T_INT32:
        return out + struct.pack(f"<IQ{len(items)}i", T_INT32, len(items), *items)
    if elem == T_BOOL:  # one byte each
        return out + struct.pack("<IQ", T_BOOL, len(items)) + bytes(bool(x) for x in items)
    assert elem == T_STRING
    return out + struct.pack("<IQ", T_STRING, len(items)) + b"".join(string(s) for s in items)


def tensor_bytes(ggml_type, shape):
    n = math.prod(shape)
    if ggml_type in BLOCK_BYTES:
        return n // BLOCK * BLOCK_BYTES[ggml_type]
    return n * VALUE_BYTES[ggml_type]


def f32(a, dtype):
    """A tensor read as stored (bf16 as its uint16 bits) as float32 values."""
    import numpy as np
    if dtype == "BF16":
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


def bf16_blocks(raw):
    """bf16 bytes (whole rows) -> f32 array of blocks of BLOCK values, one block a row."""
    import numpy as np  # only to quantize

    bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16  # bf16 is f32's high half
    return bits.view(np.float32).reshape(-1, BLOCK)


def blocks_bytes(d, codes):
    """Per-block f32 scales (n, 1) and uint8 codes (n, k) -> n blocks of f16 scale then codes."""
    import numpy as np

    return np.concatenate([d.astype("<f2").view(np.uint8), codes], axis=1).tobytes()


def q8_0(x):
    """f32 blocks (n, BLOCK) -> Q8_0 bytes."""
    import numpy as np

    d = np.abs(x).max(axis=1, keepdims=True) / np.float32(127)
    q = np.zeros_like(x)
    np.divide(x, d, out=q, where=d > 0)
    return blocks_bytes(d, np.rint(q).astype(np.int8).view(np.uint8))


def q4_0(x):
    """f32 blocks (n, BLOCK) -> Q4_0 bytes."""
    import numpy as np

    m = np.take_along_axis(x, np.abs(x).argmax(axis=1)[:, None], axis=1)  # first of equals
    d = m / np.float32(-8)
    inv = np.zeros_like(d)
    np.divide(np.float32(1), d, out=inv, where=d != 0)  # the unrounded d, as ggml's codes use
    # x * inv + 8.5 is never below 0 (m itself gives 0.5), so the cast truncates as ggml's does.
    q = np.minimum(15, (x * inv + np.float32(8.5)).astype(np.uint8))
    half = BLOCK // 2
    return blocks_bytes(d, q[:, :half] | q[:, half:] << 4)


# By flag: the format's name, GGML type, and quantizer of f32 blocks.
QUANTS = {"--q8_0": ("Q8_0", GGML_Q8_0, q8_0), "--q4_0": ("Q4_0", GGML_Q4_0, q4_0)}


def read_header(st_path):
    with open(st_path, "rb") as f:
        (hlen,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(hlen))
    header.pop("__metadata__", None)
    return header, 8 + hlen


def qwen_tensors(st_path, header, data_start, quant, quantize, fin):
    """The GGUF tensors of a bf16 Qwen3 or Qwen3-MoE checkpoint, read from fin with the standard
    library (NumPy only to quantize)."""
    tensors = []  # (gguf name, ggml type, dims outermost first, pieces: () -> iterable of bytes)

    def pieces(ggml_type, row, chunks):
        for src_off, nbytes in chunks:
            fin.seek(src_off)
            if ggml_type == GGML_F32:  # bf16 -> f32: the bf16 bits become the high half
                raw = fin.read(nbytes)
                yield b"".join(b"\0\0" + raw[i:i + 2] for i in range(0, nbytes, 2))
                continue
            step = max(1, (1 << 24) // (row * 2)) * row * 2 if ggml_type == quant else 1 << 24
            for at in range(0, nbytes, step):
                raw = fin.read(min(step, nbytes - at))
                yield quantize(bf16_blocks(raw)) if ggml_type == quant else raw

    def add(gname, shape, chunks):
        ggml_type = GGML_F32 if len(shape) == 1 else GGML_BF16
        if quant and len(shape) > 1 and gname.split(".", 2)[-1] not in UNQUANTIZED:
            ggml_type = quant
        if ggml_type == quant and shape[-1] % BLOCK:
            fail(f"{st_path}: tensor {gname} has rows of {shape[-1]} values, "
                 f"not a multiple of {BLOCK} as {quant_name(quant)} needs")
        tensors.append((gname, ggml_type, shape,
                        lambda t=ggml_type, r=shape[-1], c=chunks: pieces(t, r, c)))

    for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        if info["dtype"] != "BF16":
            fail(f"{st_path}: tensor {name} is {info['dtype']}, only BF16 checkpoints are supported")
        begin, end = info["data_offsets"]
        shape = info["shape"]
        if name.endswith(".mlp.experts.gate_up_proj"):
            # Each expert's rows: gate first, then up.
            experts, rows, hidden = shape
            half = rows // 2 * hidden * 2
            layer = gguf_name(name.replace("experts.gate_up_proj", "gate.weight"),
                              QWEN_LAYER_NAMES).split(".")[1]
            for i, part in enumerate(["ffn_gate_exps.weight", "ffn_up_exps.weight"]):
                add(f"blk.{layer}.{part}", [experts, rows // 2, hidden],
                    [(data_start + begin + e * 2 * half + i * half, half) for e in range(experts)])
            continue
        add(gguf_name(name, QWEN_LAYER_NAMES), shape, [(data_start + begin, end - begin)])
    return tensors


def quant_name(ggml_type):
    return {GGML_Q8_0: "Q8_0", GGML_Q4_0: "Q4_0"}[ggml_type]


def repack_mxfp4(blocks, scales):
    """Checkpoint MXFP4 (..., n, 16) codes and (..., n) scales -> ggml block_mxfp4 bytes."""
    import numpy as np

    # The values of each block in order: value 2j is byte j's low nibble, 2j + 1 its high one.
    v = np.stack([blocks & 0x0F, blocks >> 4], axis=-1).reshape(*blocks.shape[:-1], BLOCK)
    # ggml's byte j: value j in the low nibble, value j + 16 in the high one; the scale first.
    codes = v[..., :BLOCK // 2] | v[..., BLOCK // 2:] << 4
    return np.concatenate([scales[..., None], codes], axis=-1).tobytes()


def gpt_oss_tensors(cfg, st_path, header, data_start, quant, quantize):
    """The GGUF tensors of a gpt-oss checkpoint (MXFP4 or float experts), read with NumPy."""
    try:
        import numpy as np
    except ImportError:
        fail("gpt-oss checkpoints need NumPy (Debian's python3-numpy, or the project's .venv/)")
    mm = np.memmap(st_path, dtype=np.uint8, mode="r")

    def array(name):
        info = header[name]
        if info["dtype"] not in NP_DTYPES:
            fail(f"{st_path}: tensor {name} is {info['dtype']}, not one of {sorted(NP_DTYPES)}")
        begin, end = info["data_offsets"]
        return mm[data_start + begin:data_start + end].view(NP_DTYPES[info["dtype"]]).reshape(
            info["shape"])

    def row_chunks(a):
        """A tensor's rows (its last dimension) in blocks of about 16 MB."""
        m = a.reshape(-1, a.shape[-1])
        step = max(1, (1 << 24) // (m.shape[1] * m.itemsize))
        for r in range(0, m.shape[0], step):
            yield m[r:r + step]

    tensors = []  # (gguf name, ggml type, dims outermost first, pieces: () -> iterable of bytes)

    def add_matrix(gname, shape, dtype, chunks):
        """A weight in its stored float type, or quantized; chunks() yields its rows in order."""
        if dtype not in STORED_TYPES:
            fail(f"{st_path}: {gname} is {dtype}, not a float type")
        if quant and gname.split(".", 2)[-1] not in UNQUANTIZED:
            if shape[-1] % BLOCK:
                fail(f"{st_path}: tensor {gname} has rows of {shape[-1]} values, "
                     f"not a multiple of {BLOCK} as {quant_name(quant)} needs")
            tensors.append((gname, quant, shape, lambda: (
                quantize(f32(np.ascontiguousarray(c), dtype).reshape(-1, BLOCK)) for c in chunks())))
        else:
            tensors.append((gname, STORED_TYPES[dtype], shape,
                            lambda: (np.ascontiguousarray(c).tobytes() for c in chunks())))

    def add_f32(gname, a, dtype):
        tensors.append((gname, GGML_F32, list(a.shape),
                        lambda: [f32(np.ascontiguousarray(a), dtype).tobytes()]))

    E, inter = cfg["num_local_experts"], cfg["intermediate_size"]
    hidden = cfg["hidden_size"]
    names = sorted(header, key=lambda n: header[n]["data_offsets"][0])
    for name in names:
        dtype, shape = header[name]["dtype"], header[name]["shape"]
        a = array(name)
        blk, rest = "", name
        if name.startswith("model.layers."):
            layer, _, rest = name[len("model.layers."):].partition(".")
            blk = f"blk.{int(layer)}."
        if rest in ("mlp.experts.gate_up_proj_scales", "mlp.experts.down_proj_scales"):
            continue  # written with the blocks
        if rest in ("mlp.experts.gate_up_proj_blocks", "mlp.experts.down_proj_blocks"):
            scales_name = name.replace("_blocks", "_scales")
            if scales_name not in header:
                fail(f"{st_path}: {name} has no {scales_name}")
            scales = array(scales_name)
            gate_up = "gate_up" in rest
            rows, k = (2 * inter, hidden) if gate_up else (hidden, inter)
            if dtype != "U8" or header[scales_name]["dtype"] != "U8" or \
                    shape != [E, rows, k // BLOCK, BLOCK // 2] or \
                    header[scales_name]["shape"] != shape[:3]:
                fail(f"{st_path}: {name} is {dtype} {shape} with scales "
                     f"{header[scales_name]['dtype']} {header[scales_name]['shape']}; "
                     f"MXFP4 of {[E, rows, k]} needs U8 {[E, rows, k // BLOCK, BLOCK // 2]} and "
                     f"U8 {[E, rows, k // BLOCK]}")
            parts = [("ffn_gate_exps.weight", slice(0, None, 2)),
                     ("ffn_up_exps.weight", slice(1, None, 2))] if gate_up else \
                [("ffn_down_exps.weight", slice(None))]
            for part, sel in parts:
                tensors.append((blk + part, GGML_MXFP4, [E, len(range(rows)[sel]), k],
                                lambda b=a, s=scales, sel=sel: (
                                    repack_mxfp4(np.asarray(b[e, sel]), np.asarray(s[e, sel]))
                                    for e in range(E))))
            continue
        if rest == "mlp.experts.gate_up_proj":  # (experts, hidden, 2 x inter): gate, up interleaved
            if shape != [E, hidden, 2 * inter]:
                fail(f"{st_path}: {name} is {shape}, expected {[E, hidden, 2 * inter]}")
            for part, first in (("ffn_gate_exps.weight", 0), ("ffn_up_exps.weight", 1)):
                add_matrix(blk + part, [E, inter, hidden], dtype,
                           lambda a=a, first=first: (a[e][:, first::2].T for e in range(E)))
            continue
        if rest == "mlp.experts.down_proj":  # (experts, inter, hidden)
            if shape != [E, inter, hidden]:
                fail(f"{st_path}: {name} is {shape}, expected {[E, inter, hidden]}")
            add_matrix(blk + "ffn_down_exps.weight", [E, hidden, inter], dtype,
                       lambda a=a: (a[e].T for e in range(E)))
            continue
        if rest == "mlp.experts.gate_up_proj_bias":  # (experts, 2 x inter): gate, up interleaved
            add_f32(blk + "ffn_gate_exps.bias", a[:, 0::2], dtype)
            add_f32(blk + "ffn_up_exps.bias", a[:, 1::2], dtype)
            continue
        gname = gguf_name(name, GPT_OSS_LAYER_NAMES)
        if len(shape) == 1 or not gname.endswith(".weight") or gname.endswith("norm.weight"):
            add_f32(gname, a, dtype)
        else:
            add_matrix(gname, shape, dtype, lambda a=a: row_chunks(a))
            if name == "model.embed_tokens.weight" and "lm_head.weight" not in header:
                if not cfg.get("tie_word_embeddings", False):
                    fail(f"{st_path}: no lm_head.weight, and config.json does not tie the head")
                add_matrix("output.weight", shape, dtype, lambda a=a: row_chunks(a))
    return tensors


def gpt_oss_meta(cfg, a):
    """The hyperparameters llama.cpp's gpt-oss reads (src/models/openai-moe.cpp and the common
    ones of llama_model_base::load_hparams), and what llama.cpp will compute differently."""
    n = cfg["num_hidden_layers"]
    head_dim = cfg.get("head_dim", 64)  # GptOssConfig's default
    for key, llama_cpp in (("swiglu_alpha", 1.702), ("swiglu_limit", 7.0)):
        if key in cfg and float(cfg[key]) != llama_cpp:
            warn(f"config.json has {key} {cfg[key]}; llama.cpp's gpt-oss computes with {llama_cpp}")
    if not cfg.get("attention_bias", True):
        fail("config.json has attention_bias false; llama.cpp's gpt-oss needs attn_output.bias")
    # layer_types as llama.cpp's period p: layer l slides when p == 0 or l % p < p - 1.
    types = cfg.get("layer_types") or [
        "sliding_attention" if l % 2 == 0 else "full_attention" for l in range(n)]
    sliding = [t == "sliding_attention" for t in types]
    for period in [2, 0, 1] + list(range(3, n + 1)):
        if all(s == (period == 0 or l % period < period - 1) for l, s in enumerate(sliding)):
            break
    else:
        fail(f"config.json: layer_types {types} is no pattern llama.cpp expresses "
             "(layer l sliding when l % p < p - 1)")
    meta = [
        kv(f"{a}.expert_count", T_UINT32, cfg["num_local_experts"]),
        kv(f"{a}.expert_used_count", T_UINT32, cfg["num_experts_per_tok"]),
        kv(f"{a}.expert_feed_forward_length", T_UINT32, cfg["intermediate_size"]),
        kv(f"{a}.attention.sliding_window", T_UINT32, cfg.get("sliding_window") or 128),
        kv(f"{a}.rope.dimension_count", T_UINT32, head_dim),
    ]
    if period != 2:
        meta.append(kv(f"{a}.attention.sliding_window_pattern", T_UINT32, period))
    # Transformers 5 writes rope_parameters (with rope_theta), earlier versions rope_scaling.
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling")
    theta = cfg.get("rope_theta") or (rope or {}).get("rope_theta") or 150000.0
    if rope is None:  # gpt-oss's YaRN (GptOssConfig)
        rope = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                "truncate": False, "original_max_position_embeddings": 4096}
    kind = rope.get("rope_type") or rope.get("type")
    if kind == "yarn":
        for key, llama_cpp in (("beta_fast", 32.0), ("beta_slow", 1.0)):
            if float(rope.get(key, llama_cpp)) != llama_cpp:
                warn(f"YaRN's {key} is {rope[key]}; llama.cpp's gpt-oss computes with {llama_cpp}")
        if not rope.get("truncate", True):
            warn("YaRN's truncate is false; llama.cpp rounds the correction range to whole "
                 "dimensions (truncate true), so a few rotary frequencies differ")
        for key in ("attention_factor", "mscale", "mscale_all_dim"):
            if rope.get(key) is not None:
                warn(f"YaRN's {key} is not written; llama.cpp scales by 0.1 ln(factor) + 1")
        meta += [
            kv(f"{a}.rope.scaling.type", T_STRING, "yarn"),
            kv(f"{a}.rope.scaling.factor", T_FLOAT32, float(rope["factor"])),
            kv(f"{a}.rope.scaling.original_context_length", T_UINT32,
               int(rope.get("original_max_position_embeddings") or
                   cfg["max_position_embeddings"])),
        ]
    elif kind not in (None, "default"):
        fail(f"config.json: rope type {kind!r}, only yarn or none are written for gpt-oss")
    return meta, theta, head_dim


def qwen35_tensors(cfg, st_path, header, data_start):
    """The GGUF tensors of a Qwen3.5 checkpoint (Qwen3_5ForCausalLM), read with NumPy, as
    llama.cpp's converter transforms them (see the module's docstring)."""
    try:
        import numpy as np
    except ImportError:
        fail("Qwen3.5 checkpoints need NumPy (Debian's python3-numpy, or the project's .venv/)")
    mm = np.memmap(st_path, dtype=np.uint8, mode="r")
    kh, vh = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    kd, vd = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    if vh % kh:
        fail(f"{st_path}: {vh} value heads are no multiple of {kh} key heads")
    per_key = vh // kh

    def tiled(a, axis, head_dim):
        """a with its value heads along axis (vh x head_dim entries) in ggml's tiled order:
        new head j * kh + g is old head g * per_key + j (_LinearAttentionVReorderBase)."""
        if per_key == 1:
            return a
        shape = a.shape
        a = a.reshape(shape[:axis] + (kh, per_key, head_dim) + shape[axis + 1:])
        return np.swapaxes(a, axis, axis + 1).reshape(shape)

    tensors = []  # (gguf name, ggml type, dims outermost first, pieces: () -> iterable of bytes)

    def add_matrix(gname, shape, dtype, rows):
        """A matrix in its stored type; rows() gives it, whole or in blocks of rows."""
        tensors.append((gname, STORED_TYPES[dtype], shape,
                        lambda: (np.ascontiguousarray(r).tobytes() for r in rows())))

    def add_f32(gname, shape, values):
        """values() gives the tensor in f32, whole."""
        tensors.append((gname, GGML_F32, shape,
                        lambda: [np.ascontiguousarray(values(), dtype=np.float32).tobytes()]))

    keys = 2 * kh * kd  # the q and k channels of in_proj_qkv and conv1d, before the v ones
    for name in sorted(header, key=lambda n: header[n]["data_offsets"][0]):
        info = header[name]
        dtype, shape = info["dtype"], info["shape"]
        if name.startswith(("mtp.", "model.mtp.")):
            warn(f"{name} is not written (multi-token prediction; the converter's --no-mtp)")
            continue
        if dtype not in STORED_TYPES:
            fail(f"{st_path}: tensor {name} is {dtype}, not one of {sorted(STORED_TYPES)}")
        begin, end = info["data_offsets"]
        a = mm[data_start + begin:data_start + end].view(NP_DTYPES[dtype]).reshape(shape)
        rest = name
        if name.startswith("model.layers."):
            rest = name[len("model.layers."):].partition(".")[2]
        gname = gguf_name(name, QWEN35_LAYER_NAMES)
        if rest in QWEN35_PLUS_ONE:
            add_f32(gname, shape, lambda a=a, d=dtype: f32(a, d) + np.float32(1))
        elif rest == "linear_attn.A_log":
            # -exp(A_log), rounded once (NumPy's f32 exp is off by up to 2 units in the last
            # place; the converter's, torch's, agrees with this within 1).
            add_f32(gname, shape, lambda a=a, d=dtype: (
                -np.exp(tiled(f32(a, d), 0, 1).astype(np.float64))).astype(np.float32))
        elif rest == "linear_attn.dt_bias":
            add_f32(gname, shape, lambda a=a, d=dtype: tiled(f32(a, d), 0, 1))
        elif rest == "linear_attn.conv1d.weight":  # (channels, 1, kernel) -> (channels, kernel)
            if len(shape) != 3 or shape[1] != 1 or shape[0] != keys + vh * vd:
                fail(f"{st_path}: {name} is {shape}, expected {[keys + vh * vd, 1, 'kernel']}")
            add_f32(gname, [shape[0], shape[2]], lambda a=a, d=dtype: np.concatenate(
                [f32(a[:keys, 0], d), tiled(f32(a[keys:, 0], d), 0, vd)]))
        elif len(shape) == 1:  # linear_attn.norm: w as it is
            add_f32(gname, shape, lambda a=a, d=dtype: f32(a, d))
        elif rest == "linear_attn.in_proj_qkv.weight":
            add_matrix(gname, shape, dtype, lambda a=a: (a[:keys], tiled(a[keys:], 0, vd)))
        elif rest == "linear_attn.in_proj_z.weight":
            add_matrix(gname, shape, dtype, lambda a=a: [tiled(a, 0, vd)])
        elif rest in ("linear_attn.in_proj_b.weight", "linear_attn.in_proj_a.weight"):
            add_matrix(gname, shape, dtype, lambda a=a: [tiled(a, 0, 1)])
        elif rest == "linear_attn.out_proj.weight":  # its columns are the value heads'
            add_matrix(gname, shape, dtype, lambda a=a: [tiled(a, 1, vd)])
        else:
            step = max(1, (1 << 24) // (shape[-1] * a.itemsize))
            add_matrix(gname, shape, dtype,
                       lambda a=a, step=step: (a[r:r + step] for r in range(0, len(a), step)))
    return tensors


def qwen35_meta(cfg, a):
    """The hyperparameters llama.cpp's qwen35 reads (src/models/qwen35.cpp), as
    Qwen3NextModel.set_gguf_parameters and _Qwen35MRopeMixin write them."""
    n = cfg["num_hidden_layers"]
    interval = cfg.get("full_attention_interval", 4)
    types = cfg.get("layer_types") or [
        "linear_attention" if (l + 1) % interval else "full_attention" for l in range(n)]
    if any((t == "linear_attention") != bool((l + 1) % interval) for l, t in enumerate(types)):
        fail(f"config.json: layer_types {types} is not one full-attention layer in every "
             f"{interval}, the only pattern llama.cpp's qwen35 takes from the converter")
    if cfg["linear_key_head_dim"] != cfg["linear_value_head_dim"]:
        fail("config.json: linear_key_head_dim and linear_value_head_dim differ; llama.cpp's "
             "qwen35 takes both from ssm.state_size")
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    kind = rope.get("rope_type") or rope.get("type")
    if kind not in (None, "default"):
        fail(f"config.json: rope type {kind!r}; only the default rotary is written for Qwen3.5")
    theta = rope.get("rope_theta") or cfg.get("rope_theta")
    if theta is None:
        fail("config.json: no rope_theta")
    partial = rope.get("partial_rotary_factor") or cfg.get("partial_rotary_factor") or 0.25
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    sections = list(rope.get("mrope_section") or [11, 11, 10])
    sections = (sections + [0] * 4)[:4]
    meta = [
        kv(f"{a}.ssm.conv_kernel", T_UINT32, cfg["linear_conv_kernel_dim"]),
        kv(f"{a}.ssm.state_size", T_UINT32, cfg["linear_key_head_dim"]),
        kv(f"{a}.ssm.group_count", T_UINT32, cfg["linear_num_key_heads"]),
        kv(f"{a}.ssm.time_step_rank", T_UINT32, cfg["linear_num_value_heads"]),
        kv(f"{a}.ssm.inner_size", T_UINT32,
           cfg["linear_value_head_dim"] * cfg["linear_num_value_heads"]),
        kv(f"{a}.full_attention_interval", T_UINT32, interval),
        kv(f"{a}.rope.dimension_count", T_UINT32, int(head_dim * partial)),
        kv(f"{a}.rope.dimension_sections", T_ARRAY, (T_INT32, sections)),
    ]
    return meta, theta, head_dim



def gemma4_layers(cfg):
    """Per layer: (sliding, head_dim, KV heads), as Gemma4TextConfig resolves them. Transformers
    5.23 writes per_layer_config (overrides by layer index); the released configs say
    global_head_dim (512 when absent) and num_global_key_value_heads (taken only with
    attention_k_eq_v) for every full layer instead."""
    n = cfg["num_hidden_layers"]
    types = list(cfg.get("layer_types") or
                 ["sliding_attention" if (l + 1) % 6 else "full_attention" for l in range(n)])
    if len(types) != n or set(types) - {"sliding_attention", "full_attention"}:
        fail(f"config.json: layer_types {types} is not {n} sliding_attention or full_attention")
    types[-1] = "full_attention"  # Gemma4TextConfig forces it
    if cfg.get("per_layer_config") is not None:
        per = {int(l): c for l, c in cfg["per_layer_config"].items()}
    else:
        full = {"head_dim": cfg.get("global_head_dim", 512)}
        if cfg.get("attention_k_eq_v") and cfg.get("num_global_key_value_heads") is not None:
            full["num_key_value_heads"] = cfg["num_global_key_value_heads"]
        per = {l: full for l, t in enumerate(types) if t == "full_attention"}
    layers = []
    for l, t in enumerate(types):
        c = per.get(l, {})
        if set(c) - {"head_dim", "num_key_value_heads"}:
            fail(f"config.json: per_layer_config of layer {l} sets {sorted(c)}; only head_dim and "
                 "num_key_value_heads are read")
        layers.append((t == "sliding_attention", c.get("head_dim") or cfg["head_dim"],
                       c.get("num_key_value_heads") or cfg["num_key_value_heads"]))
    return layers


def gemma4_check_kv_sharing(sliding, shared):
    """Fails unless llama.cpp gives each KV-shared layer the keys and values Transformers gives it.
    Transformers reads the last unshared layer of the same type; llama.cpp (the reuse callback of
    gemma4's KV cache in llama-model.cpp) reads, with f the first shared layer, layer f - 1 for a
    full layer and f - 2 for a sliding one: the same layers only when f - 1 is full and f - 2
    sliding, as in the released E2B and E4B (shared layers from just after a full one)."""
    if shared == 0:
        return
    n = len(sliding)
    first = n - shared
    if first < 2:
        fail(f"num_kv_shared_layers {shared} of {n} layers: llama.cpp needs 2 unshared layers")
    for l in range(first, n):
        same = [j for j in range(first) if sliding[j] == sliding[l]]
        if not same:
            fail(f"KV-shared layer {l} has no unshared layer of its type (Transformers refuses it)")
        llama_cpp = first - (2 if sliding[l] else 1)
        if same[-1] != llama_cpp:
            kind = "sliding" if sliding[l] else "full"
            fail(f"KV-shared {kind} layer {l} reads layer {same[-1]}'s keys and values in "
                 f"Transformers, but llama.cpp's gemma4 gives it layer {llama_cpp}'s (the last "
                 f"unshared layer, {first - 1}, for a full layer and the one before, {first - 2}, "
                 "for a sliding one), so no GGUF computes this model in llama.cpp: it needs "
                 "layer_types with a full layer just before the shared ones and a sliding one "
                 "before that")


def gemma4_hparams(cfg):
    """What llama.cpp's gemma4 needs from config.json, checked against what it computes."""
    if cfg.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        fail(f"config.json: hidden_activation {cfg['hidden_activation']!r}; llama.cpp's gemma4 "
             "computes gelu_pytorch_tanh")
    if cfg.get("attention_bias"):
        fail("config.json: attention_bias true; llama.cpp's gemma4 has no attention biases")
    if cfg.get("use_bidirectional_attention") == "all":
        fail("config.json: use_bidirectional_attention 'all'; llama.cpp's gemma4 is causal")
    layers = gemma4_layers(cfg)
    sliding = [s for s, _, _ in layers]
    dims = {s: {d for t, d, _ in layers if t == s} for s in (True, False)}
    if len(dims[True]) > 1 or len(dims[False]) > 1:
        fail(f"config.json: head sizes {sorted(dims[True])} (sliding) and {sorted(dims[False])} "
             "(full); llama.cpp's gemma4 has one of each")
    head_dim = dims[False].pop()
    shared = cfg.get("num_kv_shared_layers") or 0
    gemma4_check_kv_sharing(sliding, shared)
    inter, first_shared = cfg["intermediate_size"], len(layers) - shared
    n_ff = inter
    if cfg.get("use_double_wide_mlp") and shared:  # twice as wide in the KV-shared layers
        n_ff = [inter * (2 if l >= first_shared else 1) for l in range(len(layers))]
    kv_heads = [k for _, _, k in layers]
    if len(set(kv_heads)) == 1:
        kv_heads = kv_heads[0]

    rope = cfg.get("rope_parameters") or {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                           "rope_theta": 1000000.0}}
    local, full = rope["sliding_attention"], rope["full_attention"]
    if local.get("rope_type", "default") != "default":
        fail(f"config.json: sliding layers' rope type {local['rope_type']!r}; only default")
    # Transformers' default rope of Gemma 4 rotates the whole head (no partial_rotary_factor);
    # proportional rotates the first partial_rotary_factor x head_dim / 2 frequency pairs, with
    # the periods theta^(2i / head_dim) of the whole head, and leaves the other dimensions as
    # they are. ggml's rope computes that over rope.dimension_count = head_dim when rope_freqs
    # divides the frequencies of the unrotated pairs by 1e30.
    kind = full.get("rope_type", "default")
    factor = 1.0
    if kind == "proportional":
        rotated = int(full.get("partial_rotary_factor", 1.0) * head_dim // 2)
        factor = float(full.get("factor", 1.0))  # divides the frequencies (linear scaling)
    elif kind == "default":
        rotated = head_dim // 2
    else:
        fail(f"config.json: full layers' rope type {kind!r}; only proportional or default")
    return {
        "sliding": sliding, "head_dim": head_dim,
        "head_dim_swa": dims[True].pop() if dims[True] else cfg["head_dim"],
        "kv_heads": kv_heads, "n_ff": n_ff, "shared": shared,
        "theta": full["rope_theta"], "theta_swa": local["rope_theta"],
        "factor": factor,
        "rope_freqs": [1.0] * rotated + [1e30] * (head_dim // 2 - rotated),
    }


def gemma4_tensors(cfg, g, st_path, header, data_start, quant, quantize):
    """The GGUF tensors of a Gemma 4 checkpoint (Gemma4ForCausalLM), read with NumPy, as
    llama.cpp's converter writes them (see the module's docstring), and rope_freqs."""
    try:
        import numpy as np
    except ImportError:
        fail("Gemma 4 checkpoints need NumPy (Debian's python3-numpy, or the project's .venv/)")
    mm = np.memmap(st_path, dtype=np.uint8, mode="r")
    tied = cfg.get("tie_word_embeddings", True)
    if not tied and "lm_head.weight" not in header:
        fail(f"{st_path}: no lm_head.weight, and config.json does not tie the head")
    per_layer = cfg.get("hidden_size_per_layer_input", 256) or 0
    if per_layer and cfg.get("vocab_size_per_layer_input", 262144) != cfg["vocab_size"]:
        fail(f"config.json: vocab_size_per_layer_input {cfg.get('vocab_size_per_layer_input')} "
             f"is not vocab_size {cfg['vocab_size']}; llama.cpp's per_layer_token_embd has a row "
             "for each token of the vocabulary")

    tensors = []  # (gguf name, ggml type, dims outermost first, pieces: () -> iterable of bytes)

    def add_matrix(gname, shape, dtype, a):
        """A weight (2-D, or 3-D for the experts) in its stored type, or quantized, in blocks of
        rows of about 16 MB."""
        rows = a.reshape(-1, shape[-1])
        step = max(1, (1 << 24) // (shape[-1] * rows.itemsize))

        def chunks():
            return (np.ascontiguousarray(rows[r:r + step]) for r in range(0, len(rows), step))

        if quant and gname.split(".", 2)[-1] not in UNQUANTIZED:
            if shape[-1] % BLOCK:
                fail(f"{st_path}: tensor {gname} has rows of {shape[-1]} values, "
                     f"not a multiple of {BLOCK} as {quant_name(quant)} needs")
            tensors.append((gname, quant, shape, lambda: (
                quantize(f32(c, dtype).reshape(-1, BLOCK)) for c in chunks())))
        else:
            tensors.append((gname, STORED_TYPES[dtype], shape,
                            lambda: (c.tobytes() for c in chunks())))

    for name in sorted(header, key=lambda n: header[n]["data_offsets"][0]):
        info = header[name]
        dtype, shape = info["dtype"], info["shape"]
        if dtype not in STORED_TYPES:
            fail(f"{st_path}: tensor {name} is {dtype}, not one of {sorted(STORED_TYPES)}")
        if name == "lm_head.weight" and tied:
            warn("lm_head.weight is not written: config.json ties the head to the embedding, as "
                 "Transformers does (llama.cpp's gemma4 then multiplies by token_embd)")
            continue
        begin, end = info["data_offsets"]
        a = mm[data_start + begin:data_start + end].view(NP_DTYPES[dtype]).reshape(shape)
        gname = GEMMA4_MODEL_NAMES.get(name) or gguf_name(name, GEMMA4_LAYER_NAMES)
        if len(shape) == 1:  # norms (w as it is), layer_scalar, the router's scales: f32
            tensors.append((gname, GGML_F32, shape,
                            lambda a=a, d=dtype: [f32(np.asarray(a), d).tobytes()]))
        else:
            add_matrix(gname, shape, dtype, a)
    factors = np.array(g["rope_freqs"], dtype="<f4")
    tensors.append(("rope_freqs.weight", GGML_F32, [len(factors)], lambda: [factors.tobytes()]))
    return tensors


def gemma4_meta(cfg, g, a):
    """The hyperparameters llama.cpp's gemma4 reads (src/models/gemma4.cpp and the common ones of
    llama_model_base::load_hparams) beyond main's, as Gemma4Model.set_gguf_parameters writes
    them."""
    meta = [
        kv(f"{a}.attention.sliding_window", T_UINT32, cfg.get("sliding_window", 512)),
        kv(f"{a}.attention.sliding_window_pattern", T_ARRAY, (T_BOOL, g["sliding"])),
        kv(f"{a}.attention.key_length_swa", T_UINT32, g["head_dim_swa"]),
        kv(f"{a}.attention.value_length_swa", T_UINT32, g["head_dim_swa"]),
        kv(f"{a}.attention.shared_kv_layers", T_UINT32, g["shared"]),
        kv(f"{a}.rope.dimension_count", T_UINT32, g["head_dim"]),
        kv(f"{a}.rope.dimension_count_swa", T_UINT32, g["head_dim_swa"]),
        kv(f"{a}.rope.freq_base_swa", T_FLOAT32, float(g["theta_swa"])),
        kv(f"{a}.embedding_length_per_layer_input", T_UINT32,
           cfg.get("hidden_size_per_layer_input", 256) or 0),
        # Written even without soft-capping (0, none): llama.cpp caps at 30 when the key is
        # absent, where llama.cpp's converter leaves it out.
        kv(f"{a}.final_logit_softcapping", T_FLOAT32,
           float(cfg.get("final_logit_softcapping") or 0.0)),
    ]
    if g["factor"] != 1.0:  # llama.cpp's linear scaling: of the full layers only
        meta += [kv(f"{a}.rope.scaling.type", T_STRING, "linear"),
                 kv(f"{a}.rope.scaling.factor", T_FLOAT32, g["factor"])]
    if cfg.get("enable_moe_block"):
        meta += [kv(f"{a}.expert_count", T_UINT32, cfg["num_experts"]),
                 kv(f"{a}.expert_used_count", T_UINT32, cfg["top_k_experts"]),
                 kv(f"{a}.expert_feed_forward_length", T_UINT32, cfg["moe_intermediate_size"])]
    return meta


def uint_or_array(key, value):
    """A uint32 key, or an int32 array of one value a layer."""
    if isinstance(value, list):
        return kv(key, T_ARRAY, (T_INT32, value))
    return kv(key, T_UINT32, value)


def main():
    args = sys.argv[1:]
    flags = [a for a in args if a in QUANTS]
    args = [a for a in args if a not in QUANTS]
    if len(args) != 2 or len(flags) > 1:
        sys.exit(__doc__)
    _, quant, quantize = QUANTS[flags[0]] if flags else (None, None, None)
    src, dst = args
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    archs = {"qwen3": "qwen3", "qwen3_moe": "qwen3moe", "qwen3_5_text": "qwen35",
             "gpt_oss": "gpt-oss", "gemma4_text": "gemma4"}
    if cfg.get("model_type") not in archs:
        fail(f"{src}/config.json: model_type {cfg.get('model_type')!r}, only 'qwen3', "
             "'qwen3_moe', 'qwen3_5_text', 'gpt_oss' and 'gemma4_text' are supported")
    st_path = os.path.join(src, "model.safetensors")
    header, data_start = read_header(st_path)
    a = archs[cfg["model_type"]]
    fin = open(st_path, "rb")

    extra, pre = [], "qwen2"
    theta, head_dim = cfg.get("rope_theta"), cfg.get("head_dim")
    # A family may give these per layer (a list, written as an array).
    n_ff, n_kv = cfg["intermediate_size"], cfg["num_key_value_heads"]
    if a == "gpt-oss":
        tensors = gpt_oss_tensors(cfg, st_path, header, data_start, quant, quantize)
        extra, theta, head_dim = gpt_oss_meta(cfg, a)
        pre = "gpt-4o"  # gpt-oss's o200k pretokenizer in llama.cpp; unused for token ids
    elif a == "qwen35":
        if quant:
            fail("Qwen3.5 checkpoints are written as stored only (no --q8_0 or --q4_0)")
        tensors = qwen35_tensors(cfg, st_path, header, data_start)
        extra, theta, head_dim = qwen35_meta(cfg, a)
        pre = "qwen35"
    elif a == "gemma4":
        g = gemma4_hparams(cfg)
        tensors = gemma4_tensors(cfg, g, st_path, header, data_start, quant, quantize)
        extra = gemma4_meta(cfg, g, a)
        theta, head_dim, n_ff, n_kv = g["theta"], g["head_dim"], g["n_ff"], g["kv_heads"]
        pre = "default"  # llama.cpp's plain BPE pretokenizer; unused for token ids
    else:
        tensors = qwen_tensors(st_path, header, data_start, quant, quantize, fin)
        if a == "qwen3moe":
            extra = [kv(f"{a}.expert_count", T_UINT32, cfg["num_experts"]),
                     kv(f"{a}.expert_used_count", T_UINT32, cfg["num_experts_per_tok"]),
                     kv(f"{a}.expert_feed_forward_length", T_UINT32, cfg["moe_intermediate_size"])]
    meta = extra + [
        kv("general.architecture", T_STRING, a),
        kv("general.name", T_STRING, os.path.basename(os.path.normpath(src))),
        kv(f"{a}.block_count", T_UINT32, cfg["num_hidden_layers"]),
        kv(f"{a}.context_length", T_UINT32, cfg["max_position_embeddings"]),
        kv(f"{a}.embedding_length", T_UINT32, cfg["hidden_size"]),
        uint_or_array(f"{a}.feed_forward_length", n_ff),
        kv(f"{a}.attention.head_count", T_UINT32, cfg["num_attention_heads"]),
        uint_or_array(f"{a}.attention.head_count_kv", n_kv),
        kv(f"{a}.attention.key_length", T_UINT32, head_dim),
        kv(f"{a}.attention.value_length", T_UINT32, head_dim),
        kv(f"{a}.rope.freq_base", T_FLOAT32, float(theta)),
        kv(f"{a}.attention.layer_norm_rms_epsilon", T_FLOAT32, float(cfg["rms_norm_eps"])),
        kv("tokenizer.ggml.model", T_STRING, "gpt2"),
        kv("tokenizer.ggml.pre", T_STRING, pre),
        kv("tokenizer.ggml.tokens", T_ARRAY, (T_STRING, [f"<t{i}>" for i in range(cfg["vocab_size"])])),
        kv("tokenizer.ggml.merges", T_ARRAY, (T_STRING, [])),
    ]

    infos, offset = [], 0
    for gname, ggml_type, shape, _ in tensors:
        dims = list(reversed(shape))  # GGUF lists the innermost dimension first
        infos.append(string(gname) + struct.pack("<I", len(dims)) +
                     b"".join(struct.pack("<Q", d) for d in dims) +
                     struct.pack("<IQ", ggml_type, offset))
        offset += (tensor_bytes(ggml_type, shape) + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT

    head = b"GGUF" + struct.pack("<IQQ", GGUF_VERSION, len(tensors), len(meta))
    head += b"".join(meta) + b"".join(infos)
    head += b"\0" * (-len(head) % ALIGNMENT)
    with fin, open(dst, "wb") as fout:
        fout.write(head)
        for gname, ggml_type, shape, pieces in tensors:
            written = 0
            for piece in pieces():
                fout.write(piece)
                written += len(piece)
            assert written == tensor_bytes(ggml_type, shape), (gname, written)
            fout.write(b"\0" * (-written % ALIGNMENT))
    print(f"wrote {dst}: {len(tensors)} tensors, {os.path.getsize(dst) / 1e9:.2f} GB")


if __name__ == "__main__":
    main()
