// Tensor parallelism for the Llama-style decoders: the default plan (as Transformers'
// base_model_tp_plan and _tp_plan) and the checks that a resolved plan can run.
#include "distributed/tp_model.h"
#include "models/layers.h"
#include "tformers/error.h"

namespace tformers::models {

using distributed::TpStyle;

void Architecture::validate_tp(const ModelConfig& c, distributed::TpModel&) const {
  throw UnsupportedError(c.architecture +
                         " declares no tensor-parallel plan: load it without distributed_config");
}

std::map<std::string, std::string> decoder_tp_plan(const DecoderOptions& o) {
  std::map<std::string, std::string> plan = {
      {"embed_tokens", "embedding_rowwise"},    {"layers.*.self_attn.q_proj", "colwise"},
      {"layers.*.self_attn.k_proj", "colwise"}, {"layers.*.self_attn.v_proj", "colwise"},
      {"layers.*.self_attn.o_proj", "rowwise"}, {"layers.*.mlp.gate_proj", "colwise"},
      {"layers.*.mlp.up_proj", "colwise"},      {"layers.*.mlp.down_proj", "rowwise"},
      {"lm_head", "colwise_gather_output"},
  };
  if (o.qk_norm) {
    plan["layers.*.self_attn.q_norm"] = "replicated_with_grad_allreduce";
    plan["layers.*.self_attn.k_norm"] = "replicated_with_grad_allreduce";
  }
  return plan;
}

namespace {

bool replicated(TpStyle s) {
  return s == TpStyle::kReplicate || s == TpStyle::kReplicatedWithGradAllreduce;
}
// A linear layer's output is split over ranks (its consumer must take a split input).
bool splits_output(TpStyle s) { return s == TpStyle::kColwise; }
// A linear layer expects its input split over ranks.
bool splits_input(TpStyle s) { return s == TpStyle::kRowwise; }

std::string styles_list(std::initializer_list<TpStyle> styles) {
  std::string out;
  for (TpStyle s : styles) out += (out.empty() ? "" : ", ") + std::string(style_name(s));
  return out;
}

}  // namespace

void validate_decoder_tp(const ModelConfig& c, distributed::TpModel& tp) {
  const int P = tp.size();
  auto style = [&](const std::string& w) { return tp.shard(w).style; };
  auto bad = [&](const std::string& w, const std::string& why) {
    throw InvalidArgumentError("tp_plan: '" + w + "' is " + style_name(style(w)) + " (rule '" +
                               tp.rule_for(w) + "'), which " + why);
  };
  const std::string linear_ok =
      styles_list({TpStyle::kColwise, TpStyle::kRowwise, TpStyle::kColwiseGatherOutput,
                   TpStyle::kRowwiseSplitInput, TpStyle::kReplicate});
  auto check_linear = [&](const std::string& w) {
    TpStyle s = style(w);
    if (s == TpStyle::kEmbeddingRowwise || s == TpStyle::kPackedColwise)
      bad(w, "does not apply to an unfused linear layer; use one of " + linear_ok);
  };
  // Token embedding and norms.
  for (const auto& w : {std::string("model.embed_tokens.weight")})
    if (!replicated(style(w)) && style(w) != TpStyle::kEmbeddingRowwise)
      bad(w, "does not apply to an embedding; use embedding_rowwise or replicate");
  if (!replicated(style("model.norm.weight")))
    bad("model.norm.weight", "cannot split a norm over features; use replicate");
  const std::string head = "lm_head.weight";
  check_linear(head);
  if (splits_output(style(head)) || splits_input(style(head)))
    bad(head,
        "would leave the logits split or expect a split input; use colwise_gather_output, "
        "rowwise_split_input or replicate");

  int64_t kv_local = c.num_key_value_heads;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string n = "model.layers." + std::to_string(l) + ".";
    for (const char* norm : {"input_layernorm.weight", "post_attention_layernorm.weight",
                             "self_attn.q_norm.weight", "self_attn.k_norm.weight"})
      if (tp.has(n + norm) && !replicated(style(n + norm)))
        bad(n + norm, "cannot split a norm over heads or features; use replicate");
    // Attention: q, k and v split their heads alike, and o_proj takes what they give.
    const std::string q = n + "self_attn.q_proj.weight", k = n + "self_attn.k_proj.weight",
                      v = n + "self_attn.v_proj.weight", o = n + "self_attn.o_proj.weight";
    for (const auto& w : {q, k, v, o}) check_linear(w);
    for (const auto& w : {q, k, v})
      if (splits_input(style(w))) bad(w, "expects a split input, but its input is replicated");
    const bool split_heads = splits_output(style(q));
    if (splits_output(style(k)) != split_heads || splits_output(style(v)) != split_heads)
      throw InvalidArgumentError(
          "tp_plan: " + n +
          "self_attn.{q,k,v}_proj must all split their heads (colwise) or all "
          "keep them whole; got q_proj " +
          style_name(style(q)) + ", k_proj " + style_name(style(k)) + ", v_proj " +
          style_name(style(v)));
    if (split_heads && (c.num_attention_heads % P || c.num_key_value_heads % P))
      throw InvalidArgumentError(
          "tp_size " + std::to_string(P) + " does not divide num_key_value_heads " +
          std::to_string(c.num_key_value_heads) + " (num_attention_heads " +
          std::to_string(c.num_attention_heads) +
          "), so attention heads cannot be split over the ranks (rule '" + tp.rule_for(k) +
          "' is colwise). Replicate attention on every rank and keep the MLP split with "
          "DistributedConfig.tp_plan = {\"layers.*.self_attn.q_proj\": \"replicate\", "
          "\"layers.*.self_attn.k_proj\": \"replicate\", \"layers.*.self_attn.v_proj\": "
          "\"replicate\", \"layers.*.self_attn.o_proj\": \"replicate\"}, or use a tp_size that "
          "divides " +
          std::to_string(c.num_key_value_heads));
    if (splits_input(style(o)) != split_heads)
      bad(o, split_heads ? "needs the whole attention output, but q/k/v_proj split the heads; "
                           "use rowwise"
                         : "expects split heads, but q/k/v_proj keep them whole; use replicate "
                           "or rowwise_split_input");
    if (splits_output(style(o))) bad(o, "would leave the residual stream split");
    if (l == 0)
      kv_local = split_heads ? c.num_key_value_heads / P : c.num_key_value_heads;
    else if (kv_local != (split_heads ? c.num_key_value_heads / P : c.num_key_value_heads))
      throw InvalidArgumentError("tp_plan: layers must all split attention heads the same way ('" +
                                 tp.rule_for(k) + "' differs from layer 0)");
    // MLP: gate and up alike, down_proj takes what they give.
    const std::string g = n + "mlp.gate_proj.weight", u = n + "mlp.up_proj.weight",
                      d = n + "mlp.down_proj.weight";
    for (const auto& w : {g, u, d}) check_linear(w);
    for (const auto& w : {g, u})
      if (splits_input(style(w))) bad(w, "expects a split input, but its input is replicated");
    if (splits_output(style(g)) != splits_output(style(u)))
      throw InvalidArgumentError("tp_plan: " + n +
                                 "mlp.gate_proj and up_proj must be split alike; "
                                 "got " +
                                 style_name(style(g)) + " and " + style_name(style(u)));
    if (splits_input(style(d)) != splits_output(style(g)))
      bad(d, splits_output(style(g)) ? "needs the whole MLP activation, but gate/up_proj split "
                                       "it; use rowwise"
                                     : "expects a split activation, but gate/up_proj keep it "
                                       "whole; use replicate or rowwise_split_input");
    if (splits_output(style(d))) bad(d, "would leave the residual stream split");
  }
  tp.local_kv_heads = kv_local;
}

}  // namespace tformers::models
