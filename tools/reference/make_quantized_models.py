"""Writes tiny 4-bit AWQ and GPTQ checkpoints under tests/data/models/ and their float32 goldens.

The checkpoints are packed as AutoAWQ and AutoGPTQ write them; the goldens come from unpacking
those files again with the formats' dequantization formulas (written here from their
definitions, not from the packer above them), saving the float32 result as a plain checkpoint
in a temporary folder and running Transformers on it (AutoModelForCausalLM, eager attention,
the float model's logits and greedy tokens, as make_goldens.py records them). Formats, for a linear weight W (N outputs, K inputs) quantized in groups of g
consecutive inputs:

AWQ, quant_method "awq", version "gemm" (AutoAWQ's WQLinear_GEMM), zero_point true:
  qweight  I32 (K, N/8): bits 4i..4i+3 of qweight[k, c] hold the code of output 8c + ORDER[i],
           ORDER = [0, 2, 4, 6, 1, 3, 5, 7] (so output 8c + j is in nibble [0, 4, 1, 5, 2, 6,
           3, 7][j])
  qzeros   I32 (K/g, N/8), packed the same way
  scales   F16 (K/g, N)
  W[n, k] = scales[k / g, n] * (code[k, n] - zero[k / g, n])

GPTQ, quant_method "gptq" (AutoGPTQ / Optimum), checkpoint_format "gptq" (the classic one):
  qweight  I32 (K/8, N): bits 4i..4i+3 of qweight[r, n] hold the code of input 8r + i
  qzeros   I32 (groups, N/8): bits 4i..4i+3 of qzeros[q, c] hold zero[q, 8c + i] - 1 (stored
           minus one, so a zero point of 0 cannot be stored; checkpoint_format "gptq_v2" stores
           it as is)
  scales   F16 (groups, N)
  g_idx    I32 (K): the group of input k (k / g unless desc_act reordered the columns)
  W[n, k] = scales[g_idx[k], n] * (code[k, n] - (stored_zero[g_idx[k], n] + 1))
  sym true stores every zero point as 8 (7 stored).

Codes here are round-to-nearest per group (min/max asymmetric); how a real AWQ or GPTQ run
chooses scales does not change the formats. lm_head and embeddings stay float16, as both tools
leave them.

Run: .venv/bin/python tools/reference/make_quantized_models.py (deterministic)
"""

import json
import os
import sys
import tempfile

import numpy as np
import torch
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from make_goldens import (MAX_NEW_TOKENS, PROMPTS, check_versions, greedy_full,  # noqa: E402
                          greedy_static, prompt_logits, setup_torch, write_golden)
from make_tiny_models import full_config, make_weights  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from safetensors_io import read_safetensors, write_safetensors  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))
MODELS_DIR = os.path.join(ROOT, "tests", "data", "models")
GOLDENS_DIR = os.path.join(ROOT, "tests", "data", "goldens")

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
LINEARS = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]

SHAPE = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=32,
             max_position_embeddings=512, torch_dtype="float16")

# name -> (seed, config, quantization_config)
MODELS = {
    # Groups of 128 (the common AWQ setting), an untied float16 head.
    "tiny-llama-awq": (
        2001,
        dict(SHAPE, architectures=["LlamaForCausalLM"], model_type="llama", rope_theta=10000.0,
             attention_bias=False, mlp_bias=False, tie_word_embeddings=False),
        {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True,
         "version": "gemm"},
    ),
    # Groups of 64 with zero points (sym false) and g_idx, tied embeddings.
    "tiny-qwen3-gptq": (
        2002,
        dict(SHAPE, architectures=["Qwen3ForCausalLM"], model_type="qwen3",
             rope_theta=1000000.0, attention_bias=False, tie_word_embeddings=True),
        {"quant_method": "gptq", "bits": 4, "group_size": 64, "desc_act": False, "sym": False,
         "checkpoint_format": "gptq", "true_sequential": True, "damp_percent": 0.01},
    ),
}


def quantize_groups(w, g, min_zero):
    """Round-to-nearest asymmetric 4-bit codes of w (N, K) in groups of g inputs: codes (N, K),
    f16 scales and zero points (N, K / g). Codes use the f16-rounded scale they are stored with."""
    n, k = w.shape
    groups = w.reshape(n, k // g, g)
    lo = groups.amin(-1).clamp(max=0)
    hi = groups.amax(-1).clamp(min=0)
    scale = ((hi - lo) / 15).clamp(min=1e-5).half().float()
    zero = torch.round(-lo / scale).clamp(min_zero, 15)
    codes = torch.round(groups / scale[..., None]) + zero[..., None]
    return codes.clamp(0, 15).to(torch.int64).reshape(n, k), scale.half(), zero.to(torch.int64)


def pack_nibbles(values, order):
    """int64 values in [0, 15], last dim a multiple of 8 -> I32 words: nibble i of word c holds
    values[..., 8c + order[i]]."""
    v = values.numpy().astype(np.uint32)
    v = v.reshape(*v.shape[:-1], v.shape[-1] // 8, 8)
    word = np.zeros(v.shape[:-1], dtype=np.uint32)
    for i, j in enumerate(order):
        word |= (v[..., j] & 0xF) << np.uint32(4 * i)
    return torch.from_numpy(word.view(np.int32))


def values(codes, scale, zero, g):
    """The weights (N, K) that codes, scales and zero points stand for, in float32."""
    return (scale.float().repeat_interleave(g, 1) * (codes - zero.repeat_interleave(g, 1)).float())


def awq_tensors(w, g):
    codes, scale, zero = quantize_groups(w, g, 0)
    return {"qweight": pack_nibbles(codes.t().contiguous(), AWQ_ORDER),  # (K, N/8)
            "qzeros": pack_nibbles(zero.t().contiguous(), AWQ_ORDER),    # (K/g, N/8)
            "scales": scale.t().contiguous()}, values(codes, scale, zero, g)


def gptq_tensors(w, g):
    # A stored zero point is zero - 1, so zero points start at 1.
    codes, scale, zero = quantize_groups(w, g, 1)
    k = w.shape[1]
    # qweight packs along the inputs: (N, K) codes -> words (N, K/8), transposed to (K/8, N).
    return {"qweight": pack_nibbles(codes, list(range(8))).t().contiguous(),
            "qzeros": pack_nibbles((zero - 1).t().contiguous(), list(range(8))),  # (K/g, N/8)
            "scales": scale.t().contiguous(),
            "g_idx": torch.arange(k, dtype=torch.int32) // g}, values(codes, scale, zero, g)


# ---- Dequantization, from the formats' definitions (the module docstring).

def nibble(words, i):
    """Nibble i of every I32 word, as int64 in [0, 15]."""
    return (words.to(torch.int64) >> (4 * i)) & 0xF


def dequantize_awq(t, g):
    qweight, qzeros, scales = t["qweight"], t["qzeros"], t["scales"].float()
    k, n = qweight.shape[0], qweight.shape[1] * 8
    code = torch.empty(k, n, dtype=torch.int64)
    zero = torch.empty(qzeros.shape[0], n, dtype=torch.int64)
    for i, out in enumerate(AWQ_ORDER):
        code[:, out::8] = nibble(qweight, i)
        zero[:, out::8] = nibble(qzeros, i)
    group = torch.arange(k) // g
    return (scales[group] * (code - zero[group]).float()).t().contiguous()  # (N, K)


def dequantize_gptq(t):
    qweight, qzeros, scales, g_idx = t["qweight"], t["qzeros"], t["scales"].float(), t["g_idx"]
    k, n = qweight.shape[0] * 8, qweight.shape[1]
    code = torch.empty(k, n, dtype=torch.int64)
    zero = torch.empty(qzeros.shape[0], n, dtype=torch.int64)
    for i in range(8):
        code[i::8, :] = nibble(qweight, i)
        zero[:, i::8] = nibble(qzeros, i) + 1
    group = g_idx.to(torch.int64)
    return (scales[group] * (code - zero[group]).float()).t().contiguous()


def write_model(name, seed, overrides, qconfig):
    config = full_config(overrides)
    weights = make_weights(config, seed)
    config["quantization_config"] = qconfig
    g = qconfig["group_size"]
    tensors, meant = {}, {}
    for key, w in weights.items():
        prefix = key[:-len(".weight")]
        if any(prefix.endswith(lin) for lin in LINEARS):
            packed, meant[key] = (awq_tensors(w, g) if qconfig["quant_method"] == "awq"
                                  else gptq_tensors(w, g))
            for part, t in packed.items():
                tensors[prefix + "." + part] = t
        else:
            tensors[key] = w.half()
    out = os.path.join(MODELS_DIR, name)
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):
        os.remove(os.path.join(out, f))
    write_safetensors(os.path.join(out, "model.safetensors"), tensors, {"format": "pt"})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": 2, "transformers_version":
                   config["transformers_version"]}, f, indent=2)
        f.write("\n")
    return meant


def dequantized_checkpoint(name):
    """The checkpoint read back and dequantized: config (without quantization_config) and float32
    weights under the float model's names."""
    path = os.path.join(MODELS_DIR, name)
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    q = config.pop("quantization_config")
    stored = read_safetensors(os.path.join(path, "model.safetensors"))
    weights = {}
    for key, t in stored.items():
        prefix, part = key.rsplit(".", 1)
        if part in ("qzeros", "scales", "g_idx"):
            continue
        if part == "qweight":
            parts = {p: stored[prefix + "." + p] for p in ("qweight", "qzeros", "scales", "g_idx")
                     if prefix + "." + p in stored}
            weights[prefix + ".weight"] = (dequantize_awq(parts, q["group_size"])
                                           if q["quant_method"] == "awq"
                                           else dequantize_gptq(parts))
        else:
            weights[key] = t.float()
    return config, weights


def float_model(config, weights):
    """Transformers' float32 model of the dequantized weights, loaded from a plain checkpoint."""
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(dict(config, torch_dtype="float32"), f)
        save_file({k: v.contiguous() for k, v in weights.items()},
                  os.path.join(tmp, "model.safetensors"), {"format": "pt"})
        model = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32,
                                                     attn_implementation="eager")
    return model.eval()


def main():
    check_versions()
    setup_torch()
    for name, (seed, overrides, qconfig) in MODELS.items():
        meant = write_model(name, seed, overrides, qconfig)
        config, weights = dequantized_checkpoint(name)
        # The file read back by the formulas gives exactly the weights the codes were made for.
        for key, w in meant.items():
            assert torch.equal(weights[key], w), (name, key)
        model = float_model(config, weights)
        cases = []
        for ids in PROMPTS:
            logits = prompt_logits(model, ids)
            tokens, margins = greedy_full(model, ids, MAX_NEW_TOKENS)
            assert tokens[0] == int(torch.argmax(logits[-1]))
            # The KV-cache path of Transformers gives the same tokens.
            assert greedy_static(model, ids, MAX_NEW_TOKENS) == tokens, name
            cases.append({"input_ids": ids, "greedy": tokens, "greedy_margins": margins,
                          "logits": logits.numpy().astype(np.float32)})
        header = {"model": name, "dtype": "float32", "checkpoint_dtype": "float16",
                  "quantization": qconfig["quant_method"], "max_new_tokens": MAX_NEW_TOKENS,
                  "generator": "tools/reference/make_quantized_models.py (transformers "
                               "5.23.0, torch 2.15.0)"}
        path = os.path.join(GOLDENS_DIR, f"{name}.float32.json")
        write_golden(path, header, cases)
        size = os.path.getsize(os.path.join(MODELS_DIR, name, "model.safetensors"))
        print(f"{name}: {size / 1024:.0f} KiB checkpoint, golden {os.path.getsize(path) / 1024:.0f} "
              f"KiB, min greedy margin {min(min(c['greedy_margins']) for c in cases):.4f}")


if __name__ == "__main__":
    main()
