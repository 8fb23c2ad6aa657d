"""A PyTorch re-implementation of LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM,
MistralForCausalLM, GlmForCausalLM, Glm4ForCausalLM and Gemma3ForCausalLM.

It follows the semantics of Hugging Face Transformers' modeling_llama.py / modeling_qwen2.py /
modeling_qwen3.py / modeling_mistral.py / modeling_glm.py / modeling_glm4.py / modeling_gemma3.py
with
eager attention, op for op and dtype for dtype, so that its logits are what Transformers would
produce for the same checkpoint loaded with `torch_dtype=dtype` on CPU:

  embed_tokens -> N x [ input_layernorm -> self_attn -> residual add
                        -> post_attention_layernorm -> mlp -> residual add ]
  -> norm -> lm_head

* RMSNorm: x.float(); var = mean(x^2); x * rsqrt(var + eps); weight * x.to(input dtype).
* Attention: q/k/v projections (bias if attention_bias; Qwen2 always has q/k/v biases and no
  o_proj bias: whatever biases the checkpoint holds are applied); Qwen3 applies q_norm / k_norm (RMSNorm
  over head_dim) per head before RoPE; RoPE rotate-half, inv_freq in float32, cos/sin computed in
  float32 and cast to the activation dtype; llama3 rope_scaling as in
  _compute_llama3_parameters; repeat_kv for GQA; scores * head_dim**-0.5 + causal mask of
  finfo(dtype).min; softmax in float32 cast back to the query dtype; o_proj.
* Qwen2's sliding window: with use_sliding_window, layers from max_window_layers on let a query at
  position p see keys p - sliding_window < j <= p (the sliding mask on cache positions).
* MLP: down_proj(silu(gate_proj(x)) * up_proj(x)) (bias if mlp_bias, Llama only).
* lm_head tied to embed_tokens when tie_word_embeddings.
* Mistral: sliding_window (when set) on every layer; head_dim from the config.
* GLM: RoPE over the first partial_rotary_factor * head_dim features only, rotating the pairs
  (2i, 2i+1) with frequency i (cos/sin's first half repeat_interleave'd); the rest pass through.
  One gate_up_proj whose output halves are gate and up. GLM-4 adds post_self_attn_layernorm after
  attention and post_mlp_layernorm after the MLP, before each residual add.
* Gemma 3: RMSNorm as x.float() * rsqrt(mean(x^2) + eps) * (1 + w.float()), cast back; the
  embedding times sqrt(hidden_size) rounded to the weight dtype; q_norm/k_norm; scores scaled by
  query_pre_attn_scalar^-0.5 (not soft-capped: Transformers ignores attn_logit_softcapping);
  sliding layers (layer_types, or every layer but each sliding_window_pattern-th) use the window
  and RoPE base rope_local_base_freq, global ones rope_theta with rope_scaling; post_attention,
  pre_feedforward and post_feedforward norms; gelu-tanh MLP; final logits soft-capped when
  final_logit_softcapping.

Only the model is here; no generation utilities beyond a plain greedy loop.

The model goldens now come from Transformers itself (make_goldens.py, make_beam_goldens.py,
perplexity.py, make_quantized_models.py); this module remains for make_generation_goldens.py.
Against Transformers 5.23.0 it agrees to 1.1e-6 relative in float32 on every tiny model.
"""

import json
import math
import os

import torch
import torch.nn.functional as F

from safetensors_io import read_safetensors

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def load_checkpoint(model_dir):
    """Returns (config dict, {name: tensor} in the checkpoint's stored dtype)."""
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    index_path = os.path.join(model_dir, "model.safetensors.index.json")
    weights = {}
    if os.path.exists(index_path):
        with open(index_path) as f:
            index = json.load(f)
        for shard in sorted(set(index["weight_map"].values())):
            part = read_safetensors(os.path.join(model_dir, shard))
            for name in part:
                assert index["weight_map"][name] == shard, name
            weights.update(part)
        assert set(weights) == set(index["weight_map"]), "index and shards disagree"
    else:
        weights = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    return config, weights


class Model:
    """A causal LM from a config and a weight dict, computing in `dtype`."""

    def __init__(self, config, weights, dtype):
        arch = config["architectures"][0]
        assert arch in ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                        "MistralForCausalLM", "GlmForCausalLM", "Glm4ForCausalLM",
                        "Gemma3ForCausalLM"), arch
        self.is_gemma3 = arch == "Gemma3ForCausalLM"
        self.is_glm = arch in ("GlmForCausalLM", "Glm4ForCausalLM")
        self.is_glm4 = arch == "Glm4ForCausalLM"
        self.qk_norm = arch == "Qwen3ForCausalLM" or self.is_gemma3
        self.config = config
        self.dtype = dtype
        # from_pretrained(torch_dtype=dtype) casts every parameter to dtype.
        self.w = {k: v.to(dtype) for k, v in weights.items()}
        if config.get("tie_word_embeddings", False):
            assert "lm_head.weight" not in self.w
            self.w["lm_head.weight"] = self.w["model.embed_tokens.weight"]
        self.hidden_size = config["hidden_size"]
        self.num_heads = config["num_attention_heads"]
        self.num_kv_heads = config.get("num_key_value_heads") or self.num_heads
        self.head_dim = config.get("head_dim") or self.hidden_size // self.num_heads
        self.eps = config["rms_norm_eps"]
        self.scaling = (config["query_pre_attn_scalar"] if self.is_gemma3 else self.head_dim)**-0.5
        # Transformers' Gemma3Attention does not pass attn_logit_softcapping to its attention
        # function, so the scores are never capped there; neither are they here.
        self.attn_softcap = 0
        self.final_softcap = config.get("final_logit_softcapping") or 0
        self.rotary_dim = int(self.head_dim * config.get("partial_rotary_factor", 1.0))
        n = config["num_hidden_layers"]
        # Per layer: the sliding window (0 = full attention).
        window = config.get("sliding_window") or 0
        if arch == "MistralForCausalLM":
            sliding = [True] * n
        elif self.is_gemma3:
            types = config.get("layer_types") or [
                "sliding_attention" if (i + 1) % config["sliding_window_pattern"] else
                "full_attention" for i in range(n)]
            sliding = [t == "sliding_attention" for t in types]
        else:
            first_sliding = config.get("max_window_layers", n)
            on = arch == "Qwen2ForCausalLM" and config.get("use_sliding_window", False)
            sliding = [on and i >= first_sliding for i in range(n)]
        self.windows = [window if s else 0 for s in sliding]
        # Per layer: inv_freq. Gemma 3's sliding layers use their own base and no scaling.
        global_inv = self._compute_inv_freq(float(config["rope_theta"]), config.get("rope_scaling"))
        local_inv = global_inv
        if self.is_gemma3:
            local_inv = self._compute_inv_freq(float(config["rope_local_base_freq"]), None)
        self.inv_freqs = [local_inv if s else global_inv for s in sliding]

    # --- rotary embedding -------------------------------------------------------------------
    def _compute_inv_freq(self, base, rs):
        dim = self.rotary_dim
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        if rs is None:
            return inv_freq
        rope_type = rs.get("rope_type", rs.get("type"))
        if rope_type == "default":
            return inv_freq
        if rope_type == "linear":
            return inv_freq / rs["factor"]
        assert rope_type == "llama3", rope_type
        factor = rs["factor"]
        low_freq_factor = rs["low_freq_factor"]
        high_freq_factor = rs["high_freq_factor"]
        old_context_len = rs["original_max_position_embeddings"]
        low_freq_wavelen = old_context_len / low_freq_factor
        high_freq_wavelen = old_context_len / high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        # Wavelengths longer than low_freq_wavelen are scaled down by factor, shorter than
        # high_freq_wavelen kept, and the ones between interpolated smoothly.
        inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth_factor = (old_context_len / wavelen - low_freq_factor) / (
            high_freq_factor - low_freq_factor
        )
        smoothed = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
        is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        return torch.where(is_medium, smoothed, inv_freq_llama)

    def rotary(self, position_ids, inv_freq):
        """position_ids [B, T] -> cos, sin [B, T, rotary_dim] in self.dtype (attention_scaling 1)."""
        inv = inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
        pos = position_ids[:, None, :].float()
        freqs = (inv @ pos).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(self.dtype), emb.sin().to(self.dtype)

    # --- building blocks --------------------------------------------------------------------
    def rms_norm(self, x, weight):
        if self.is_gemma3:
            h = x.float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
            return (h * (1.0 + weight.float())).type_as(x)
        input_dtype = x.dtype
        h = x.to(torch.float32)
        variance = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(variance + self.eps)
        return weight * h.to(input_dtype)

    def linear(self, x, prefix):
        return F.linear(x, self.w[prefix + ".weight"], self.w.get(prefix + ".bias"))

    @staticmethod
    def rotate_half(x):
        x1 = x[..., : x.shape[-1] // 2]
        x2 = x[..., x.shape[-1] // 2 :]
        return torch.cat((-x2, x1), dim=-1)

    @staticmethod
    def rotate_pairs(x):
        """GLM's pairing: (x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...)."""
        return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)

    def apply_rope(self, x, cos, sin):
        # x [B, H, T, D]; cos, sin [B, T, rotary_dim]
        cos = cos.unsqueeze(1)
        sin = sin.unsqueeze(1)
        if not self.is_glm:
            return (x * cos) + (self.rotate_half(x) * sin)
        cos = cos[..., : cos.shape[-1] // 2].repeat_interleave(2, dim=-1)
        sin = sin[..., : sin.shape[-1] // 2].repeat_interleave(2, dim=-1)
        rot, rest = x[..., : self.rotary_dim], x[..., self.rotary_dim :]
        return torch.cat([rot * cos + self.rotate_pairs(rot) * sin, rest], dim=-1)

    @staticmethod
    def repeat_kv(x, n_rep):
        b, h, t, d = x.shape
        if n_rep == 1:
            return x
        return x[:, :, None, :, :].expand(b, h, n_rep, t, d).reshape(b, h * n_rep, t, d)

    def qkv(self, i, x, cos, sin):
        """Normed hidden x [B, T, hidden] -> q [B, H, T, D], k, v [B, Hkv, T, D], RoPE applied."""
        p = f"model.layers.{i}.self_attn"
        b, t, _ = x.shape
        shape = (b, t, -1, self.head_dim)
        q = self.linear(x, p + ".q_proj").view(shape)
        k = self.linear(x, p + ".k_proj").view(shape)
        v = self.linear(x, p + ".v_proj").view(shape).transpose(1, 2)
        if self.qk_norm:
            q = self.rms_norm(q, self.w[p + ".q_norm.weight"])
            k = self.rms_norm(k, self.w[p + ".k_norm.weight"])
        q = q.transpose(1, 2)
        k = k.transpose(1, 2)
        return self.apply_rope(q, cos, sin), self.apply_rope(k, cos, sin), v

    def attend(self, i, q, k, v, mask):
        """Eager attention: q [B, H, T, D], k, v [B, Hkv, S, D], additive mask [T, S]."""
        n_rep = self.num_heads // self.num_kv_heads
        k = self.repeat_kv(k, n_rep)
        v = self.repeat_kv(v, n_rep)
        scores = torch.matmul(q, k.transpose(2, 3)) * self.scaling
        if self.attn_softcap:
            scores = torch.tanh(scores / self.attn_softcap) * self.attn_softcap
        scores = scores + mask
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(probs, v).transpose(1, 2).contiguous()
        out = out.reshape(out.shape[0], out.shape[1], -1)
        return self.linear(out, f"model.layers.{i}.self_attn.o_proj")

    def mlp(self, i, x):
        p = f"model.layers.{i}.mlp"
        if self.is_glm:
            gate, up = self.linear(x, p + ".gate_up_proj").chunk(2, dim=-1)
            return self.linear(up * F.silu(gate), p + ".down_proj")
        if self.is_gemma3:
            gate = F.gelu(self.linear(x, p + ".gate_proj"), approximate="tanh")
            return self.linear(gate * self.linear(x, p + ".up_proj"), p + ".down_proj")
        return self.linear(F.silu(self.linear(x, p + ".gate_proj")) * self.linear(x, p + ".up_proj"),
                           p + ".down_proj")

    def causal_mask(self, t, s, offset, window=0):
        """Additive [t, s] mask: query row r (absolute position offset + r) sees keys <= it, and
        with a window only the last `window` of those."""
        min_value = torch.finfo(self.dtype).min
        q_pos = torch.arange(t)[:, None] + offset
        k_pos = torch.arange(s)[None, :]
        hidden = k_pos > q_pos
        if window:
            hidden = hidden | (k_pos <= q_pos - window)
        mask = torch.zeros(t, s, dtype=self.dtype)
        return mask.masked_fill(hidden, min_value)

    # --- forward ----------------------------------------------------------------------------
    def forward(self, input_ids, cache=None):
        """input_ids: list of ints. Returns logits [T, V] (model dtype) for every position.

        Without `cache` the sequence is computed from scratch. With a cache (a list of per-layer
        [k, v] tensors, possibly empty lists) the tokens are appended after the cached ones, as
        a dynamic KV cache does; used only to cross-check the masking of the full recompute.
        """
        ids = torch.tensor([input_ids], dtype=torch.int64)
        past = 0
        if cache is not None and cache[0]:
            past = cache[0][0].shape[2]
        t = ids.shape[1]
        position_ids = torch.arange(past, past + t)[None, :]
        table = self.w["model.embed_tokens.weight"]
        h = F.embedding(ids, table)
        if self.is_gemma3:
            h = h * torch.tensor(self.hidden_size**0.5, dtype=table.dtype)
        masks = {w: self.causal_mask(t, past + t, past, w) for w in set(self.windows)}
        # Norm names: before attention, after it, before the MLP, after it ("" none).
        if self.is_gemma3:
            names = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm")
        elif self.is_glm4:
            names = ("input_layernorm", "post_self_attn_layernorm", "post_attention_layernorm",
                     "post_mlp_layernorm")
        else:
            names = ("input_layernorm", "", "post_attention_layernorm", "")
        for i in range(self.config["num_hidden_layers"]):
            p = f"model.layers.{i}."
            cos, sin = self.rotary(position_ids, self.inv_freqs[i])
            residual = h
            x = self.rms_norm(h, self.w[p + names[0] + ".weight"])
            q, k, v = self.qkv(i, x, cos, sin)
            if cache is not None:
                if cache[i]:
                    k = torch.cat([cache[i][0], k], dim=2)
                    v = torch.cat([cache[i][1], v], dim=2)
                cache[i][:] = [k, v]
            y = self.attend(i, q, k, v, masks[self.windows[i]])
            if names[1]:
                y = self.rms_norm(y, self.w[p + names[1] + ".weight"])
            h = residual + y
            residual = h
            y = self.mlp(i, self.rms_norm(h, self.w[p + names[2] + ".weight"]))
            if names[3]:
                y = self.rms_norm(y, self.w[p + names[3] + ".weight"])
            h = residual + y
        h = self.rms_norm(h, self.w["model.norm.weight"])
        logits = F.linear(h, self.w["lm_head.weight"])[0]
        if self.final_softcap:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits

    def new_cache(self):
        return [[] for _ in range(self.config["num_hidden_layers"])]


def first_argmax(row):
    """Index of the first maximal value (Transformers' greedy: torch.argmax, first on ties)."""
    row = row.float()
    return int(torch.nonzero(row == row.max())[0, 0])


def greedy(model, input_ids, max_new_tokens):
    """Greedy decoding that recomputes the whole sequence every step (no KV cache, no eos stop).

    Returns (new token ids, margins): the margin is top-1 minus top-2 logit at each step, so a test
    can tell a real divergence from a near tie.
    """
    seq = list(input_ids)
    out, margins = [], []
    for _ in range(max_new_tokens):
        last = model.forward(seq)[-1].float()
        tok = first_argmax(last)
        top2 = torch.topk(last, 2).values
        margins.append(float(top2[0] - top2[1]))
        out.append(tok)
        seq.append(tok)
    return out, margins
