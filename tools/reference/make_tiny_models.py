"""Writes the tiny random checkpoints under tests/data/models/ (fixed seeds, reproducible).

Each model is a Hugging Face model folder: config.json, generation_config.json and safetensors
(single model.safetensors, or model-0000k-of-0000n.safetensors + model.safetensors.index.json).
Run: .venv/bin/python tools/reference/make_tiny_models.py
[NAME ...] (all models without names).
"""

import json
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_io import read_safetensors, write_safetensors  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT_DIR = os.path.join(ROOT, "tests", "data", "models")

TRANSFORMERS_VERSION = "4.51.3"  # the config format version these files mimic

# GLM-4-0414's layout: 2 KV heads (so 4 ranks cannot split them), half of each head rotated in
# interleaved pairs, q/k/v biases, one gate_up_proj, post-attention and post-MLP norms.
TINY_GLM4 = dict(
    architectures=["Glm4ForCausalLM"],
    model_type="glm4",
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    partial_rotary_factor=0.5,
    attention_bias=True,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    max_position_embeddings=512,
    tie_word_embeddings=False,
    pad_token_id=0,
    torch_dtype="bfloat16",
)

# name -> (seed, config overrides, number of shards)
MODELS = {
    "tiny-qwen3": (
        1001,
        dict(
            architectures=["Qwen3ForCausalLM"],
            model_type="qwen3",
            vocab_size=512,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,  # deliberately != hidden_size / num_attention_heads (16)
            rope_theta=1000000.0,
            rope_scaling=None,
            max_position_embeddings=512,
            tie_word_embeddings=True,
            attention_bias=False,
            torch_dtype="bfloat16",
        ),
        1,
    ),
    "tiny-qwen3-sharded": (
        1022,
        dict(
            architectures=["Qwen3ForCausalLM"],
            model_type="qwen3",
            vocab_size=512,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=3,
            num_attention_heads=8,
            num_key_value_heads=2,  # GQA ratio 4
            head_dim=16,
            rope_theta=1000000.0,
            rope_scaling=None,
            max_position_embeddings=512,
            tie_word_embeddings=False,
            attention_bias=False,
            torch_dtype="float32",
        ),
        2,
    ),
    # Qwen2.5's layout (q/k/v biases, tied embeddings) with a sliding window of 8 on layer 1, so
    # prompts longer than the window exercise it.
    "tiny-qwen2": (
        1005,
        dict(
            architectures=["Qwen2ForCausalLM"],
            model_type="qwen2",
            vocab_size=512,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            rope_theta=1000000.0,
            rope_scaling=None,
            max_position_embeddings=512,
            tie_word_embeddings=True,
            use_sliding_window=True,
            sliding_window=8,
            max_window_layers=1,
            torch_dtype="bfloat16",
        ),
        1,
    ),
    "tiny-llama": (
        1003,
        dict(
            architectures=["LlamaForCausalLM"],
            model_type="llama",
            vocab_size=512,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            rope_theta=500000.0,
            # With head_dim 16 and theta 5e5 the wavelengths are 6.3, 32.4, 167, ...: one is kept
            # (< 64/4), one is smoothed (between 16 and 64) and the rest are divided by 8.
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
            max_position_embeddings=512,
            tie_word_embeddings=False,
            attention_bias=False,
            mlp_bias=False,
            torch_dtype="float32",
        ),
        1,
    ),
    # Llama with Phi-3's LongRoPE layout: a short factor per rotated pair, the pretraining length
    # top-level, and max_position_embeddings 4 times it (attention factor sqrt(1 + ln 4 / ln 64)).
    # Every golden stays within the 64 positions where Transformers uses the short factors.
    "tiny-llama-longrope": (
        1004,
        dict(
            architectures=["LlamaForCausalLM"],
            model_type="llama",
            vocab_size=512,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            rope_theta=10000.0,
            rope_scaling={
                "type": "longrope",
                "short_factor": [1.0, 1.25, 1.5, 2.0, 3.0, 4.5, 6.0, 8.0],
                "long_factor": [1.5, 2.0, 3.0, 4.0, 6.0, 9.0, 12.0, 16.0],
            },
            original_max_position_embeddings=64,
            max_position_embeddings=256,
            tie_word_embeddings=False,
            attention_bias=False,
            mlp_bias=False,
            torch_dtype="float32",
        ),
        1,
    ),
    "tiny-llama-sharded": (
        1054,
        dict(
            architectures=["LlamaForCausalLM"],
            model_type="llama",
            vocab_size=512,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,  # no GQA
            head_dim=16,
            rope_theta=10000.0,
            rope_scaling=None,
            max_position_embeddings=512,
            tie_word_embeddings=True,
            attention_bias=True,
            mlp_bias=False,
            torch_dtype="bfloat16",
        ),
        2,
    ),
    # Mistral with an explicit head_dim (32, not 64 / 4) and a window of 6 on every layer.
    "tiny-mistral": (
        1061,
        dict(
            architectures=["MistralForCausalLM"],
            model_type="mistral",
            vocab_size=512,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            rope_theta=1000000.0,
            sliding_window=6,
            max_position_embeddings=512,
            tie_word_embeddings=False,
            torch_dtype="bfloat16",
        ),
        1,
    ),
    "tiny-glm4": (1071, TINY_GLM4, 1),
    # glm-4-9b-hf's layout: GLM-4-0414 without the post norms.
    "tiny-glm": (
        1081,
        dict(
            TINY_GLM4,
            architectures=["GlmForCausalLM"],
            model_type="glm",
            rms_norm_eps=1.5625e-07,
            torch_dtype="float32",
        ),
        1,
    ),
    # Gemma 3 text: layers 0 and 2 slide over 4 positions with RoPE base 1e4, layer 1 is global
    # with base 1e6 and linear scaling (as the 4B+ models); query_pre_attn_scalar != head_dim;
    # both soft caps set small enough to bend the scores and logits.
    "tiny-gemma3": (
        1091,
        dict(
            architectures=["Gemma3ForCausalLM"],
            model_type="gemma3_text",
            vocab_size=512,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            query_pre_attn_scalar=24,
            hidden_activation="gelu_pytorch_tanh",
            sliding_window=4,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            rope_theta=1000000.0,
            rope_local_base_freq=10000.0,
            rope_scaling={"rope_type": "linear", "factor": 8.0},
            attn_logit_softcapping=2.0,
            final_logit_softcapping=4.0,
            attention_bias=False,
            max_position_embeddings=512,
            tie_word_embeddings=True,
            pad_token_id=0,
            torch_dtype="bfloat16",
        ),
        1,
    ),
}

COMMON = dict(
    hidden_act="silu",
    rms_norm_eps=1e-6,
    initializer_range=0.02,
    attention_dropout=0.0,
    use_cache=True,
    bos_token_id=1,
    eos_token_id=2,
    transformers_version=TRANSFORMERS_VERSION,
)


def full_config(overrides):
    config = dict(COMMON)
    config.update(overrides)
    if config["model_type"] == "qwen3":
        config.update(use_sliding_window=False, sliding_window=None, max_window_layers=config[
            "num_hidden_layers"])
    elif config["model_type"] == "llama":
        config.update(pretraining_tp=1)
    elif config["model_type"] == "gemma3_text":
        del config["hidden_act"]  # Gemma 3 names it hidden_activation
    return dict(sorted(config.items()))


def make_weights(config, seed):
    """Random weights in float32; scales chosen so logits spread over a few units and greedy
    decoding moves between tokens instead of repeating the prompt's last token."""
    g = torch.Generator().manual_seed(seed)

    def normal(shape, std):
        return torch.randn(*shape, generator=g) * std

    # Gemma 3 stores norm weights as offsets from 1 (its norm scales by 1 + w).
    norm_center = 0.0 if config["model_type"] == "gemma3_text" else 1.0

    def norm_weight(n):
        return norm_center + normal((n,), 0.1)

    hidden = config["hidden_size"]
    inter = config["intermediate_size"]
    vocab = config["vocab_size"]
    heads = config["num_attention_heads"]
    kv_heads = config["num_key_value_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    qwen3 = config["model_type"] == "qwen3"
    qwen2 = config["model_type"] == "qwen2"
    glm = config["model_type"] in ("glm", "glm4")
    gemma3 = config["model_type"] == "gemma3_text"
    norms = ["input_layernorm", "post_attention_layernorm"]
    if config["model_type"] == "glm4":
        norms += ["post_self_attn_layernorm", "post_mlp_layernorm"]
    if gemma3:
        norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
    # With tied embeddings the residual stream starts at the token's own embedding, so its own
    # logit wins unless the layers' outputs dominate it: give o_proj and down_proj more weight.
    out_std = 0.4 if config["tie_word_embeddings"] else 0.1
    # Gemma 3 multiplies the embedding by sqrt(hidden) (8): keep the token's own row from
    # dominating the (tied) logits.
    w = {"model.embed_tokens.weight": normal((vocab, hidden), 0.05 if gemma3 else 0.3)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}"
        for n in norms:
            w[p + "." + n + ".weight"] = norm_weight(hidden)
        a = p + ".self_attn"
        w[a + ".q_proj.weight"] = normal((heads * head_dim, hidden), 0.1)
        w[a + ".k_proj.weight"] = normal((kv_heads * head_dim, hidden), 0.1)
        w[a + ".v_proj.weight"] = normal((kv_heads * head_dim, hidden), 0.1)
        w[a + ".o_proj.weight"] = normal((hidden, heads * head_dim), out_std)
        if qwen2 or glm:  # q, k and v biases, none on o_proj
            w[a + ".q_proj.bias"] = normal((heads * head_dim,), 0.1)
            w[a + ".k_proj.bias"] = normal((kv_heads * head_dim,), 0.1)
            w[a + ".v_proj.bias"] = normal((kv_heads * head_dim,), 0.1)
        elif config.get("attention_bias"):
            w[a + ".q_proj.bias"] = normal((heads * head_dim,), 0.1)
            w[a + ".k_proj.bias"] = normal((kv_heads * head_dim,), 0.1)
            w[a + ".v_proj.bias"] = normal((kv_heads * head_dim,), 0.1)
            w[a + ".o_proj.bias"] = normal((hidden,), 0.1)
        if qwen3 or gemma3:
            w[a + ".q_norm.weight"] = norm_weight(head_dim)
            w[a + ".k_norm.weight"] = norm_weight(head_dim)
        m = p + ".mlp"
        if glm:  # [gate; up] in one matrix
            w[m + ".gate_up_proj.weight"] = normal((2 * inter, hidden), 0.1)
        else:
            w[m + ".gate_proj.weight"] = normal((inter, hidden), 0.1)
            w[m + ".up_proj.weight"] = normal((inter, hidden), 0.1)
        w[m + ".down_proj.weight"] = normal((hidden, inter), out_std)
        if config.get("mlp_bias"):
            w[m + ".gate_proj.bias"] = normal((inter,), 0.1)
            w[m + ".up_proj.bias"] = normal((inter,), 0.1)
            w[m + ".down_proj.bias"] = normal((hidden,), 0.1)
    w["model.norm.weight"] = norm_weight(hidden)
    if not config["tie_word_embeddings"]:
        w["lm_head.weight"] = normal((vocab, hidden), 0.3)
    return w


def shard_of(name, config, num_shards):
    """Layers split evenly; embeddings go with the first shard, norm and lm_head with the last."""
    if num_shards == 1:
        return 0
    if name.startswith("model.layers."):
        layer = int(name.split(".")[2])
        return min(layer * num_shards // config["num_hidden_layers"], num_shards - 1)
    return 0 if name.startswith("model.embed_tokens") else num_shards - 1


def write_model(name, seed, overrides, num_shards):
    config = full_config(overrides)
    out = os.path.join(OUT_DIR, name)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    storage = {"float32": torch.float32, "bfloat16": torch.bfloat16}[config["torch_dtype"]]
    weights = {k: v.to(storage) for k, v in make_weights(config, seed).items()}

    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    generation_config = {
        "_from_model_config": True,
        "bos_token_id": config["bos_token_id"],
        "eos_token_id": config["eos_token_id"],
        "transformers_version": TRANSFORMERS_VERSION,
    }
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump(generation_config, f, indent=2)
        f.write("\n")

    metadata = {"format": "pt"}
    if num_shards == 1:
        write_safetensors(os.path.join(out, "model.safetensors"), weights, metadata)
    else:
        weight_map = {}
        total = 0
        for s in range(num_shards):
            file = f"model-{s + 1:05d}-of-{num_shards:05d}.safetensors"
            part = {k: v for k, v in weights.items() if shard_of(k, config, num_shards) == s}
            total += write_safetensors(os.path.join(out, file), part, metadata)
            weight_map.update({k: file for k in part})
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2)
            f.write("\n")

    # Read back what was written and compare bit for bit.
    loaded = {}
    for file in sorted(os.listdir(out)):
        if file.endswith(".safetensors"):
            loaded.update(read_safetensors(os.path.join(out, file)))
    assert set(loaded) == set(weights), name
    for k, v in weights.items():
        assert loaded[k].dtype == v.dtype and torch.equal(loaded[k], v), k
    sizes = {f: os.path.getsize(os.path.join(out, f)) for f in sorted(os.listdir(out))}
    print(f"{name}: {len(weights)} tensors, files {sizes}")


def main(names):
    """Writes the named models (all without arguments)."""
    for name in names or MODELS:
        seed, overrides, num_shards = MODELS[name]
        write_model(name, seed, overrides, num_shards)


if __name__ == "__main__":
    main(sys.argv[1:])
