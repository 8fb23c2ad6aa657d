"""Writes tests/data/models/hf-<arch>/ with Transformers' own classes, and their goldens.

Each model is built from Transformers' config class and <Arch>ForCausalLM, its weights drawn with
torch.manual_seed, cast to its storage dtype and written by save_pretrained(safe_serialization=
True): the config.json, generation_config.json and model.safetensors that Transformers 5.23.0
itself produces (rope_parameters, dtype, layer_types, ...). Then make_goldens.py and
make_beam_goldens.py record these checkpoints.

Sizes follow the hand-made tiny models (vocab 512, hidden 64, intermediate 128, 2 layers, 4 query
heads on 2 KV heads, head_dim 32 != 64 / 4), each with the features of its architecture:

| model      | features                                                              | stored |
|------------|-----------------------------------------------------------------------|--------|
| hf-llama   | llama3 rope scaling (all three frequency regimes), q/k/v/o biases     | f32    |
| hf-qwen2   | q/k/v biases, sliding window 8 on layer 1 (max_window_layers 1), tied | bf16   |
| hf-qwen3   | q_norm / k_norm, tied                                                 | bf16   |
| hf-mistral | sliding window 6 on every layer                                       | f32    |
| hf-glm     | partial rotary 0.5 (interleaved), q/k/v biases, fused gate_up_proj    | f32    |
| hf-glm4    | as GLM plus post-attention and post-MLP norms                         | bf16   |
| hf-gemma3  | local (window 4, base 1e4) / global (1e6, linear x8) layers, final   | bf16   |
|            | logit soft-capping 4, query_pre_attn_scalar 24, tied, 3 layers       |        |
| hf-qwen3-moe | 8 experts of 32, top 2 renormalised, layer 1 dense (mlp_only_layers), | bf16 |
|            | q_norm / k_norm, 3 layers; saved with per-expert tensor names        |        |
| hf-mixtral | 4 experts of 64 (w1, w3, w2 under block_sparse_moe), top 2           | f32    |
| hf-glm4-moe | layer 0 dense (first_k_dense_replace), then 8 experts of 32 in 2    | f32    |
|            | groups (top 2 from the best group), sigmoid scores with a correction |        |
|            | bias, routed_scaling_factor 2.5, a shared expert, q/k/v biases,      |        |
|            | partial rotary 0.5 (rotate-half), 3 layers; saved with the fused    |        |
|            | expert tensors of Transformers 5 (gate_up_proj, down_proj) and a     |        |
|            | stand-in MTP layer (model.layers.3.*) that loaders must skip          |        |
| hf-qwen3-next | 3 Gated DeltaNet layers (2 key heads of 16, 4 value heads of 24,    | bf16   |
|            | conv 4, fused in_proj_qkvz / in_proj_ba) then 1 full-attention layer  |        |
|            | (gated q_proj, q/k norms, partial rotary 0.25, theta 1e7); 8 experts  |        |
|            | of 32 (top 2) + gated shared expert of 48, layer 1 dense; untied      |        |
| hf-qwen3-5 | Qwen3.5 text model: the same layers with separate in_proj_qkv / z /   | f32    |
|            | b / a, mrope_section [2, 1, 1] in rope_parameters, dense MLP, tied    |        |
| hf-qwen3-5-moe | as hf-qwen3-5 with 8 experts of 32 (top 2) + a shared expert of | bf16   |
|            | 48 on every layer, untied                                             |        |
| hf-qwen3-5-vl | Qwen3_5ForConditionalGeneration as the Hub's Qwen3.5 checkpoints: | f32    |
|            | hf-qwen3-5's text model (untied) under text_config and               |        |
|            | model.language_model.*, a 1-block vision tower (model.visual.*),     |        |
|            | lm_head.weight; goldens of the text path (AutoModelForCausalLM loads |        |
|            | it as Qwen3_5ForCausalLM)                                             |        |
| hf-gemma4  | 5 layers: sliding (window 4, head_dim 32) and full (proportional RoPE | f32    |
|            | 0.25 over head_dim 48, 1 KV head, values = keys' projection), the last |        |
|            | 2 KV-shared with double-wide MLPs, per-layer inputs of 16, final      |        |
|            | soft-capping 30 (as released), untied                                 |        |
| hf-gemma4-moe | 3 layers, 8 experts of 32 (top 2) beside each MLP, no per-layer    | bf16   |
|            | inputs, untied                                                        |        |
| hf-gemma4-vl | Gemma4ForConditionalGeneration as the Hub's Gemma 4 checkpoints:    | f32    |
|            | hf-gemma4's text model under text_config and model.language_model.*, |        |
|            | a 1-layer vision tower (model.vision_tower.*, model.embed_vision.*)   |        |

Weights: Transformers' initialisation (std 0.02) makes the logits nearly flat and greedy a
sequence of near-ties, so every parameter is redrawn: normal with std 0.3 for embeddings and an
untied lm_head (logits spread over a few units), 0.1 for projections and biases, norm weights
1 + N(0, 0.1) (Gemma, Qwen3-Next and Qwen3.5 store offsets from 1: N(0, 0.1); their Gated
DeltaNet's gated norm does not, 1 + N(0, 0.1)). With tied embeddings the residual stream starts
at the token's own embedding and greedy would repeat the last token, so those models use std 0.4
for o_proj, out_proj and down_proj. Gated DeltaNet: A = exp(A_log) from U(0.05, 1) (moderate
decays), conv1d taps std 0.5; see redraw().

Run: .venv/bin/python tools/reference/make_hf_models.py [NAME ...] (all without names); twice
gives byte-identical files.
"""

import json
import os
import shutil
import sys

import numpy as np
import safetensors.torch
import torch
import transformers as T

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_beam_goldens  # noqa: E402
import make_goldens  # noqa: E402

MODELS_DIR = make_goldens.MODELS_DIR

COMMON = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6,
              max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0)

# gpt-oss: 8 experts of 32 (top 4), a limit low enough that both clamps of its SwiGLU bite, sliding
# window 4 on layers 0 and 2, YaRN with truncate false and an original length the prompts pass.
GPT_OSS = dict(
    num_hidden_layers=3, tie_word_embeddings=False, intermediate_size=32, num_local_experts=8,
    num_experts_per_tok=4, sliding_window=4, swiglu_limit=1.0, attention_bias=True,
    rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=32.0, beta_fast=32.0,
                         beta_slow=1.0, truncate=False, original_max_position_embeddings=16))

# The hybrid linear-attention models (Qwen3-Next, Qwen3.5): 3 Gated DeltaNet layers, then one
# full-attention layer (gated q_proj, q_norm / k_norm, partial rotary 0.25), as the released
# configs repeat them. 2 key heads of 16 serve 4 value heads of 24 (key and value head dims
# differ on purpose), causal conv1d of width 4.
LINEAR = dict(
    num_hidden_layers=4,
    layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
    linear_value_head_dim=24, linear_conv_kernel_dim=4)
# Qwen3.5's rope_parameters nest the multimodal sections as the released configs do ([11, 11, 10]
# of 32 frequencies there); here rotary_dim 8 has 4 frequencies. Text positions are equal in all
# three sections, so for text the rope is plain partial rotary.
QWEN3_5 = dict(
    LINEAR, tie_word_embeddings=True,
    rope_parameters=dict(rope_type="default", rope_theta=10000000.0, partial_rotary_factor=0.25,
                         mrope_section=[2, 1, 1], mrope_interleaved=True))


# Gemma 4 as its small checkpoints are made (E2B, E4B): five sliding layers to one full one (here
# two of five), the full layers with their own head_dim (global_head_dim) and, with
# attention_k_eq_v, one KV head whose values are the keys' projection; the last layers reuse
# earlier layers' caches (num_kv_shared_layers); per-layer inputs (hidden_size_per_layer_input).
GEMMA4 = dict(
    num_hidden_layers=5, tie_word_embeddings=False, sliding_window=4,
    layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention",
                 "full_attention"],
    global_head_dim=48, attention_k_eq_v=True, num_global_key_value_heads=1,
    num_kv_shared_layers=2, use_double_wide_mlp=True, final_logit_softcapping=30.0,
    hidden_size_per_layer_input=16, vocab_size_per_layer_input=512,
    rope_parameters={
        "sliding_attention": dict(rope_type="default", rope_theta=10000.0),
        "full_attention": dict(rope_type="proportional", partial_rotary_factor=0.25,
                               rope_theta=1000000.0)})


def gemma4_vl_config(**text):
    """Gemma 4 as the Hub's checkpoints are saved: Gemma4Config with the text model under
    text_config and a vision tower (1 layer of width 32, patches of 4, pooled 2 x 2), no audio
    tower. The image token ids are in the tiny vocabulary but in none of the golden prompts."""
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=2, head_dim=16, patch_size=4, position_embedding_size=64,
                  pooling_kernel_size=2)
    return T.Gemma4Config(text_config=text, vision_config=vision, audio_config=None,
                          tie_word_embeddings=text["tie_word_embeddings"], boi_token_id=503,
                          eoi_token_id=504, image_token_id=505)


def qwen3_5_vl_config(**text):
    """Qwen3.5 as the Hub's checkpoints are saved: Qwen3_5Config with the text model under
    text_config and a vision tower (here 1 block of width 32, patches 4 x 4 x 2 frames, merged
    2 x 2 into the text width). The vision token ids are in the tiny vocabulary but in none of
    the golden prompts; the goldens are of the text path only."""
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, in_channels=3,
                  patch_size=4, temporal_patch_size=2, spatial_merge_size=2,
                  out_hidden_size=text["hidden_size"], num_position_embeddings=16)
    return T.Qwen3_5Config(text_config=text, vision_config=vision,
                           tie_word_embeddings=text["tie_word_embeddings"],
                           vision_start_token_id=503, vision_end_token_id=504,
                           image_token_id=505, video_token_id=506)


# name -> (seed, config class, model class, config overrides, storage dtype)
MODELS = {
    "hf-llama": (2001, T.LlamaConfig, T.LlamaForCausalLM, dict(
        attention_bias=True, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0,
                             low_freq_factor=1.0, high_freq_factor=4.0,
                             original_max_position_embeddings=64)), torch.float32),
    "hf-qwen2": (2002, T.Qwen2Config, T.Qwen2ForCausalLM, dict(
        tie_word_embeddings=True, use_sliding_window=True, sliding_window=8, max_window_layers=1,
        rope_parameters=dict(rope_type="default", rope_theta=1000000.0)), torch.bfloat16),
    "hf-qwen3": (2003, T.Qwen3Config, T.Qwen3ForCausalLM, dict(
        tie_word_embeddings=True,
        rope_parameters=dict(rope_type="default", rope_theta=1000000.0)), torch.bfloat16),
    "hf-mistral": (2004, T.MistralConfig, T.MistralForCausalLM, dict(
        tie_word_embeddings=False, sliding_window=6,
        rope_parameters=dict(rope_type="default", rope_theta=1000000.0)), torch.float32),
    "hf-glm": (2005, T.GlmConfig, T.GlmForCausalLM, dict(
        tie_word_embeddings=False, attention_bias=True,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                             partial_rotary_factor=0.5)), torch.float32),
    "hf-glm4": (2006, T.Glm4Config, T.Glm4ForCausalLM, dict(
        tie_word_embeddings=False, attention_bias=True, rms_norm_eps=1e-5,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                             partial_rotary_factor=0.5)), torch.bfloat16),
    "hf-gemma3": (2007, T.Gemma3TextConfig, T.Gemma3ForCausalLM, dict(
        num_hidden_layers=3, tie_word_embeddings=True, sliding_window=4,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        query_pre_attn_scalar=24, final_logit_softcapping=4.0,
        # Transformers' Gemma 3 attention does not apply attn_logit_softcapping (Gemma 2's
        # does); null as in the released Gemma 3 configs.
        attn_logit_softcapping=None,
        rope_parameters={
            "full_attention": dict(rope_type="linear", factor=8.0, rope_theta=1000000.0),
            "sliding_attention": dict(rope_type="default", rope_theta=10000.0)}),
        torch.bfloat16),
    "hf-qwen3-moe": (2008, T.Qwen3MoeConfig, T.Qwen3MoeForCausalLM, dict(
        num_hidden_layers=3, tie_word_embeddings=False, moe_intermediate_size=32, num_experts=8,
        num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1],
        rope_parameters=dict(rope_type="default", rope_theta=1000000.0)), torch.bfloat16),
    "hf-mixtral": (2009, T.MixtralConfig, T.MixtralForCausalLM, dict(
        tie_word_embeddings=False, intermediate_size=64, num_local_experts=4,
        num_experts_per_tok=2, rope_parameters=dict(rope_type="default", rope_theta=1000000.0)),
        torch.float32),
    "hf-glm4-moe": (2010, T.Glm4MoeConfig, T.Glm4MoeForCausalLM, dict(
        num_hidden_layers=3, tie_word_embeddings=False, attention_bias=True, use_qk_norm=False,
        moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2, n_group=2,
        topk_group=1, n_shared_experts=1, first_k_dense_replace=1, routed_scaling_factor=2.5,
        norm_topk_prob=True, rms_norm_eps=1e-5,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                             partial_rotary_factor=0.5)), torch.float32),
    "hf-gpt-oss": (2011, T.GptOssConfig, T.GptOssForCausalLM, GPT_OSS, torch.float32),
    "hf-gpt-oss-mxfp4": (2012, T.GptOssConfig, T.GptOssForCausalLM, GPT_OSS, torch.float32),
    "hf-qwen3-next": (2013, T.Qwen3NextConfig, T.Qwen3NextForCausalLM, dict(
        LINEAR, tie_word_embeddings=False, num_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=32, shared_expert_intermediate_size=48, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[1],
        rope_parameters=dict(rope_type="default", rope_theta=10000000.0,
                             partial_rotary_factor=0.25)), torch.bfloat16),
    "hf-qwen3-5": (2014, T.Qwen3_5TextConfig, T.Qwen3_5ForCausalLM, QWEN3_5, torch.float32),
    "hf-qwen3-5-moe": (2015, T.Qwen3_5MoeTextConfig, T.Qwen3_5MoeForCausalLM, dict(
        QWEN3_5, tie_word_embeddings=False, num_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=32, shared_expert_intermediate_size=48), torch.bfloat16),
    "hf-qwen3-5-vl": (2016, qwen3_5_vl_config, T.Qwen3_5ForConditionalGeneration, dict(
        QWEN3_5, tie_word_embeddings=False), torch.float32),
    "hf-gemma4": (2017, T.Gemma4TextConfig, T.Gemma4ForCausalLM, GEMMA4, torch.float32),
    "hf-gemma4-moe": (2018, T.Gemma4TextConfig, T.Gemma4ForCausalLM, dict(
        num_hidden_layers=3, tie_word_embeddings=False, sliding_window=4,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        global_head_dim=48, hidden_size_per_layer_input=0, enable_moe_block=True, num_experts=8,
        top_k_experts=2, moe_intermediate_size=32, rope_parameters=GEMMA4["rope_parameters"]),
        torch.bfloat16),
    "hf-gemma4-vl": (2019, gemma4_vl_config, T.Gemma4ForConditionalGeneration, GEMMA4,
                     torch.float32),
}

# Mixtures of experts, and those saved as Transformers 5 holds them in memory (one gate_up_proj and
# one down_proj per layer) rather than in the per-expert layout save_pretrained converts them to.
MOE_MODELS = {"hf-qwen3-moe", "hf-mixtral", "hf-glm4-moe", "hf-qwen3-next", "hf-qwen3-5-moe",
              "hf-gemma4-moe"}
FUSED_EXPERTS = {"hf-glm4-moe"}
# Experts stored as MXFP4 blocks and scales, as the released gpt-oss checkpoints are.
MXFP4_EXPERTS = {"hf-gpt-oss-mxfp4"}
# RMSNorms that scale by 1 + weight (weights stored as offsets from 1).
OFFSET_NORMS = {"hf-gemma3", "hf-qwen3-next", "hf-qwen3-5", "hf-qwen3-5-moe", "hf-qwen3-5-vl"}
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)


def redraw(model, seed, tied, offset_norms):
    """Every parameter drawn again, in named_parameters order, from one seeded generator."""
    # Gemma 4 scores attention by q.k unscaled, its q and k RMS-normed per head: with norm weights
    # near 1 the tiny model's scores spread by sqrt(head_dim) and its softmax is nearly one-hot,
    # so bf16 rounding moves Transformers' own logits by 0.18. Its q_norm and k_norm weights are
    # drawn near 0.4 (scores spread by about 1, as a trained model's are).
    unscaled_scores = type(model).__name__.startswith("Gemma4")
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "visual." in name:
                # Qwen3.5's vision tower (LayerNorms with weight and bias): not used by the text
                # goldens, drawn so that no tensor of the checkpoint is degenerate.
                layernorm = ".norm" in name and name.endswith("weight")
                p.copy_(torch.randn_like(p) * 0.1 + (1.0 if layernorm else 0.0))
            elif name.endswith("linear_attn.norm.weight"):
                # The gated RMSNorm of a Gated DeltaNet multiplies by its weight itself (ones at
                # init), unlike the offset norms of the rest of Qwen3-Next and Qwen3.5.
                p.copy_(torch.randn_like(p) * 0.1 + 1.0)
            elif name.endswith(("router.scale", "router.per_expert_scale")):
                # Gemma 4's router scales (ones at init): spread around 1.
                p.copy_(torch.randn_like(p) * 0.1 + 1.0)
            elif name.endswith("router.proj.weight"):
                # Its router's input is RMS-normed: logits of a few units separate the experts.
                p.copy_(torch.randn_like(p) * 0.3)
            elif unscaled_scores and name.endswith(("q_norm.weight", "k_norm.weight")):
                p.copy_(torch.randn_like(p) * 0.04 + 0.4)
            elif name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(torch.randn_like(p) * 0.1 + (0.0 if offset_norms else 1.0))
            elif name.endswith("linear_attn.A_log"):
                # The decay per token is exp(-exp(A_log) * softplus(a + dt_bias)). Drawn like
                # the rest (A near 1) it would be 0.23 to 0.76, median 0.5 (half the state gone
                # at every token); A = exp(A_log) from U(0.05, 1) gives 0.4 to 0.95 (5th to
                # 95th percentile over the golden prompts, 98% or more in [0.3, 0.99]).
                p.copy_(torch.empty_like(p).uniform_(0.05, 1.0).log())
            elif name.endswith("linear_attn.conv1d.weight"):
                # Depthwise taps of width 4: std 0.5 (as PyTorch's own Conv1d init, U(+-1/2)),
                # so that the silu after the convolution is not in its near-linear range.
                p.copy_(torch.randn_like(p) * 0.5)
            elif "embed_tokens" in name or "lm_head" in name:
                p.copy_(torch.randn_like(p) * 0.3)
            elif name.endswith("sinks"):
                # Logits of the order of the scores', so a sink takes a real share.
                p.copy_(torch.randn_like(p) * 1.0)
            elif "mlp.router." in name:
                # gpt-oss routes by the top k of 8 logits: spread them, so that rounding the
                # weights to bf16 rarely swaps two experts at the edge of the top k.
                p.copy_(torch.randn_like(p) * 1.0)
            elif (tied and ("o_proj" in name or "out_proj" in name or "down_proj" in name)
                  and name.endswith("weight")):
                p.copy_(torch.randn_like(p) * 0.4)
            else:
                p.copy_(torch.randn_like(p) * 0.1)
        # GLM-4.5's correction bias is a buffer: drawn too, so that it changes which experts win;
        # and Gemma 4's layer_scalar (ones at init), so that a model ignoring it is seen.
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.copy_(torch.randn_like(buf) * 0.1)
            elif name.endswith("layer_scalar"):
                buf.copy_(torch.empty_like(buf).uniform_(0.5, 1.5))


def save_fused(model, out, mtp):
    """Rewrites out/model.safetensors from the model's own state dict (fused experts); with mtp, a
    stand-in multi-token-prediction layer after the last decoder layer, as GLM-4.5 ships one."""
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if mtp:
        prefix = f"model.layers.{model.config.num_hidden_layers}."
        hidden = model.config.hidden_size
        generator = torch.Generator().manual_seed(7)
        for name, shape in [("eh_proj.weight", (hidden, 2 * hidden)), ("enorm.weight", (hidden,)),
                            ("hnorm.weight", (hidden,)), ("shared_head.norm.weight", (hidden,))]:
            state[prefix + name] = torch.randn(shape, generator=generator).to(model.dtype)
    safetensors.torch.save_file(state, os.path.join(out, "model.safetensors"),
                                metadata={"format": "pt"})


def mxfp4(w):
    """(..., N, K) floats -> (blocks (..., N, K/32, 16), scales (..., N, K/32)) uint8, the format of
    the gpt-oss checkpoints: per 32 inputs the exponent that puts their largest magnitude at most
    6, each value rounded to the nearest e2m1 code (sign in bit 3), two codes per byte, the first
    in the low nibble. Written here with numpy, independently of Transformers' dequantizer."""
    x = w.float().numpy()
    groups = x.reshape(*x.shape[:-1], x.shape[-1] // 32, 32)
    amax = np.abs(groups).max(axis=-1, keepdims=True)
    exponent = np.ceil(np.log2(np.maximum(amax, 1e-30) / 6.0)).astype(np.int32)
    scaled = groups / np.exp2(exponent)
    codes = np.abs(np.abs(scaled)[..., None] - E2M1).argmin(axis=-1).astype(np.uint8)
    codes |= np.where(scaled < 0, 8, 0).astype(np.uint8)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return torch.from_numpy(blocks), torch.from_numpy((exponent[..., 0] + 127).astype(np.uint8))


def dequantized(blocks, scales):
    """The values mxfp4() stands for, (..., N, K) float32."""
    b, s = blocks.numpy(), scales.numpy()
    codes = np.stack([b & 0xF, b >> 4], axis=-1).reshape(*b.shape[:-1], 32)
    values = E2M1[codes & 7] * np.where(codes & 8, -1.0, 1.0).astype(np.float32)
    values = values * np.exp2(s.astype(np.float32) - 127)[..., None]
    return torch.from_numpy(values.reshape(*b.shape[:-2], -1).astype(np.float32))


def use_mxfp4(model):
    """Rounds every expert weight to its MXFP4 values in place (so the model computes exactly what
    the stored blocks say) and returns the blocks and scales by checkpoint name. Transformers holds
    an expert as (in, out); the blocks are (out, in), as the released checkpoints store them."""
    packed = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                blocks, scales = mxfp4(p.transpose(-1, -2))
                p.copy_(dequantized(blocks, scales).transpose(-1, -2))
                packed[name + "_blocks"], packed[name + "_scales"] = blocks, scales
    return packed


def save_mxfp4(model, out, packed):
    """Rewrites out/ with the experts as MXFP4 blocks and scales and the quantization_config the
    released checkpoints carry."""
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k + "_blocks" not in packed}
    state.update({k: v.contiguous() for k, v in packed.items()})
    safetensors.torch.save_file(state, os.path.join(out, "model.safetensors"),
                                metadata={"format": "pt"})
    path = os.path.join(out, "config.json")
    with open(path) as f:
        config = json.load(f)
    config["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                   "model.embed_tokens", "lm_head"]}
    with open(path, "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")


def build(name):
    seed, config_cls, model_cls, overrides, storage = MODELS[name]
    kwargs = dict(COMMON)
    kwargs.update(overrides)
    config = config_cls(**kwargs)
    # Built in float32 and seeded, so the draw does not depend on the storage dtype.
    torch.manual_seed(seed)
    model = model_cls(config).to(torch.float32).eval()
    redraw(model, seed, config.tie_word_embeddings, name in OFFSET_NORMS)
    packed = use_mxfp4(model) if name in MXFP4_EXPERTS else None
    model = model.to(storage)
    model.generation_config = T.GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0)
    out = os.path.join(MODELS_DIR, name)
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(out, safe_serialization=True)
    if name in FUSED_EXPERTS:
        save_fused(model, out, mtp=True)
    if packed:
        save_mxfp4(model, out, packed)
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    print(f"{name:11s} {model_cls.__name__:20s} {str(storage):15s} {size / 1024:6.1f} KiB "
          f"-> {out}")


def main(names):
    make_goldens.check_versions()
    make_goldens.setup_torch()
    names = names or list(MODELS)
    for name in names:
        build(name)
    make_goldens.main(names)
    # Beam search is the same for every family: recorded for the models that list names.
    beams = [name for name in names if name in make_beam_goldens.MODELS]
    if beams:
        make_beam_goldens.main(beams)


if __name__ == "__main__":
    main(sys.argv[1:])
