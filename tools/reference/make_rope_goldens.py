"""Writes tests/data/goldens/rope.json: RoPE inverse frequencies and attention factors for
config.json rope settings, independently of tformers' C++ (src/models/config.cc). Default,
linear, llama3 and yarn (and partial_rotary_factor) are computed in float32 torch as
Transformers' rope initialisation functions define them, written from their definitions here.
dynamic, longrope and proportional come from Transformers itself: the frequencies its
LlamaRotaryEmbedding uses for a step whose last position is the last one tformers runs
("positions" in the case: max_position_embeddings for dynamic, the pretraining length for
longrope), after its per-step update (dynamic_rope_update).

Run: /work/refvenv/bin/python tools/reference/make_rope_goldens.py (torch and transformers 5.23)
"""

import json
import math
import os

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "data", "goldens", "rope.json")


def base_inv_freq(theta, dim):
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def yarn(config, dim):
    rs = config["rope_scaling"]
    theta = config["rope_theta"]
    factor = rs["factor"]
    orig = rs.get("original_max_position_embeddings") or config["max_position_embeddings"]

    def get_mscale(scale, mscale=1.0):
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    attention_factor = rs.get("attention_factor")
    if attention_factor is None:
        if rs.get("mscale") and rs.get("mscale_all_dim"):
            attention_factor = get_mscale(factor, rs["mscale"]) / get_mscale(
                factor, rs["mscale_all_dim"])
        else:
            attention_factor = get_mscale(factor)
    beta_fast = rs.get("beta_fast") or 32
    beta_slow = rs.get("beta_slow") or 1

    def correction_dim(rotations):
        return dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if rs.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation_weight = 1 - ramp
    pos = theta ** (torch.arange(0, dim, 2).float() / dim)
    inv = (1.0 / (factor * pos)) * (1 - extrapolation_weight) + (1.0 / pos) * extrapolation_weight
    return inv, attention_factor


def llama3(config, dim):
    rs = config["rope_scaling"]
    inv = base_inv_freq(config["rope_theta"], dim)
    factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old = rs["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / low, old / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled), 1.0


def positions_run(kind, rope_parameters, config):
    """The longest sequence tformers runs (src/models/config.cc read_decoder_config)."""
    if kind == "longrope":
        return rope_parameters["original_max_position_embeddings"]
    return config["max_position_embeddings"]


def from_transformers(config, head_dim):
    """Transformers' frequencies and attention factor at the last position tformers runs."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    heads = 4
    cfg = LlamaConfig.from_dict({**config, "head_dim": head_dim, "num_attention_heads": heads,
                                 "hidden_size": heads * head_dim})
    rotary = LlamaRotaryEmbedding(cfg)
    kind = cfg.rope_parameters["rope_type"]
    positions = positions_run(kind, cfg.rope_parameters, config)
    at_init = rotary.inv_freq.clone()
    x = torch.zeros(1, 1, head_dim)
    rotary(x, torch.tensor([[positions - 1]]))
    # One frequency set serves every step tformers runs: the one Transformers starts with.
    assert torch.equal(rotary.inv_freq, at_init), kind
    return rotary.inv_freq, rotary.attention_scaling, positions


def compute(config, head_dim):
    dim = int(head_dim * config.get("partial_rotary_factor", 1.0))
    rs = config.get("rope_scaling")
    kind = (rs or {}).get("rope_type", (rs or {}).get("type", "default"))
    if kind in ("dynamic", "longrope", "proportional"):
        return from_transformers(config, head_dim)
    if kind == "yarn":
        return (*yarn(config, dim), None)
    if kind == "llama3":
        return (*llama3(config, dim), None)
    inv = base_inv_freq(config["rope_theta"], dim)
    if kind == "linear":
        inv = inv / rs["factor"]
    return inv, 1.0, None


CASES = [
    ("default", 64, {"rope_theta": 10000.0}),
    ("partial 0.5", 128, {"rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
    ("linear", 32, {"rope_theta": 1e6, "rope_scaling": {"rope_type": "linear", "factor": 8.0}}),
    ("llama3", 128, {"rope_theta": 500000.0, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}}),
    ("yarn, Qwen-style", 128, {"rope_theta": 1e6, "max_position_embeddings": 131072,
                               "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                "original_max_position_embeddings": 32768}}),
    ("yarn, mscale ratio", 64, {"rope_theta": 10000.0, "max_position_embeddings": 163840,
                                "rope_scaling": {"type": "yarn", "factor": 40.0,
                                                 "original_max_position_embeddings": 4096,
                                                 "mscale": 1.0, "mscale_all_dim": 0.707,
                                                 "beta_fast": 32, "beta_slow": 1}}),
    ("yarn, given factor, no truncation", 64, {"rope_theta": 10000.0,
                                              "max_position_embeddings": 8192,
                                              "rope_scaling": {"rope_type": "yarn",
                                                               "factor": 2.0,
                                                               "attention_factor": 1.25,
                                                               "truncate": False}}),
    ("dynamic", 64, {"rope_theta": 10000.0, "max_position_embeddings": 4096,
                     "rope_scaling": {"rope_type": "dynamic", "factor": 4.0}}),
    ("dynamic, partial 0.5", 128, {"rope_theta": 500000.0, "partial_rotary_factor": 0.5,
                                   "max_position_embeddings": 2048,
                                   "rope_scaling": {"type": "dynamic", "factor": 2.0}}),
    ("longrope, Phi-3 layout", 32, {
        "rope_theta": 10000.0, "max_position_embeddings": 131072,
        "original_max_position_embeddings": 4096,
        "rope_scaling": {"type": "longrope",
                         "short_factor": [1.0 + 0.05 * i for i in range(16)],
                         "long_factor": [1.5 + 0.4 * i for i in range(16)]}}),
    ("longrope, given factors", 32, {
        "rope_theta": 250000.0, "max_position_embeddings": 8192,
        "rope_scaling": {"rope_type": "longrope", "factor": 2.0, "attention_factor": 1.3,
                         "original_max_position_embeddings": 2048,
                         "short_factor": [1.0 + 0.1 * i for i in range(16)],
                         "long_factor": [4.0] * 16}}),
    ("proportional, Gemma 4 full attention", 64, {
        "rope_theta": 1e6, "partial_rotary_factor": 0.25, "max_position_embeddings": 8192,
        "rope_scaling": {"rope_type": "proportional"}}),
    ("proportional, factor", 32, {
        "rope_theta": 10000.0, "partial_rotary_factor": 0.5, "max_position_embeddings": 8192,
        "rope_scaling": {"rope_type": "proportional", "factor": 8.0}}),
]


def main():
    out = []
    for name, head_dim, config in CASES:
        inv, attention_factor, positions = compute(config, head_dim)
        case = {"name": name, "head_dim": head_dim, "config": config,
                "inv_freq": [float(x) for x in inv.float()],
                "attention_factor": float(attention_factor)}
        if positions is not None:
            case["positions"] = positions
        out.append(case)
        print(f"{name:36s} {len(inv):3d} frequencies, attention factor {attention_factor:.6f}")
    with open(OUT, "w") as f:
        json.dump({"generator": "tools/reference/make_rope_goldens.py", "cases": out}, f,
                  indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
