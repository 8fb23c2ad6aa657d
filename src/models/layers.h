// Shared layers of decoder-only transformers, used by the architecture files. Each takes the
// checkpoint prefix of its weights ("model.layers.3.self_attn") so names match Transformers.
#pragma once

#include <string>
#include <vector>

#include "models/architecture.h"

namespace tformers::models {

// What differs between the Llama-family decoders we support.
struct DecoderOptions {
  bool qk_norm = false;  // Qwen3: RMSNorm over head_dim on q and k, per head, before RoPE
};

// The weights of a Llama-style decoder: embeddings, per-layer attention and gated MLP, final
// norm, lm_head (tied to embed_tokens when config.tie_word_embeddings).
std::vector<WeightSpec> decoder_weights(const ModelConfig& c, const DecoderOptions& o);

// The whole forward pass of a Llama-style decoder (see Architecture::build).
void build_decoder(graph::GraphBuilder& b, Params& p, const ModelConfig& c, const StepShape& s,
                   DType cache_dtype, const DecoderOptions& o);

// Tensor parallelism: the decoders' default plan (Transformers' base_model_tp_plan and
// _tp_plan) and the check that a resolved layout can run (see Architecture::validate_tp).
std::map<std::string, std::string> decoder_tp_plan(const DecoderOptions& o);
void validate_decoder_tp(const ModelConfig& c, distributed::TpModel& tp);

// x (..., in) -> (..., out) with "<prefix>.weight" and, when present, "<prefix>.bias".
graph::Value linear(graph::GraphBuilder& b, Params& p, graph::Value x, const std::string& prefix);

// RoPE inverse frequencies (head_dim / 2) for config.json's rope_theta and rope_scaling
// (default, linear, llama3). Other rope types are an UnsupportedError naming them.
std::vector<float> rope_inv_freq(const io::Json& config, double theta, int64_t head_dim,
                                 const std::string& where);

}  // namespace tformers::models
