"""Writes tests/data/goldens/rope.json: RoPE inverse frequencies and attention factors for
config.json rope settings, computed in float32 torch as Transformers' rope initialisation
functions define them (default, linear, llama3, yarn; partial_rotary_factor), written from
their definitions here, independently of tformers' C++ (src/models/config.cc).

Run: .venv/bin/python tools/reference/make_rope_goldens.py
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


def compute(config, head_dim):
    dim = int(head_dim * config.get("partial_rotary_factor", 1.0))
    rs = config.get("rope_scaling")
    kind = (rs or {}).get("rope_type", (rs or {}).get("type", "default"))
    if kind == "yarn":
        return yarn(config, dim)
    if kind == "llama3":
        return llama3(config, dim)
    inv = base_inv_freq(config["rope_theta"], dim)
    if kind == "linear":
        inv = inv / rs["factor"]
    return inv, 1.0


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
]


def main():
    out = []
    for name, head_dim, config in CASES:
        inv, attention_factor = compute(config, head_dim)
        out.append({"name": name, "head_dim": head_dim, "config": config,
                    "inv_freq": [float(x) for x in inv.float()],
                    "attention_factor": float(attention_factor)})
        print(f"{name:36s} {len(inv):3d} frequencies, attention factor {attention_factor:.6f}")
    with open(OUT, "w") as f:
        json.dump({"generator": "tools/reference/make_rope_goldens.py", "cases": out}, f,
                  indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
