// Tensor parallelism for the layer library: the checks that a resolved plan can run. Each layer
// checks its own weights' styles (a linear that splits its output must feed one that takes a
// split input, norms stay whole, ...); an impossible plan is an InvalidArgumentError that names
// the rule and the override that fixes it.
#include "distributed/tp_model.h"
#include "models/layers.h"
#include "tformers/error.h"

namespace tformers::models {

using distributed::TpModel;
using distributed::TpStyle;

void Architecture::validate_tp(const ArchConfig& c, const TpModel&) const {
  throw UnsupportedError(c.architecture +
                         " declares no tensor-parallel plan: load it without distributed_config");
}

namespace {

bool replicated(TpStyle s) {
  return s == TpStyle::kReplicate || s == TpStyle::kReplicatedWithGradAllreduce;
}
// A linear layer's output is split over ranks (its consumer must take a split input).
bool splits_output(TpStyle s) { return s == TpStyle::kColwise || s == TpStyle::kPackedColwise; }
// A linear layer expects its input split over ranks.
bool splits_input(TpStyle s) { return s == TpStyle::kRowwise; }

std::string styles_list(std::initializer_list<TpStyle> styles) {
  std::string out;
  for (TpStyle s : styles) out += (out.empty() ? "" : ", ") + std::string(style_name(s));
  return out;
}

struct Checker {
  const TpModel& tp;
  TpStyle style(const std::string& w) const { return tp.shard(w).style; }
  [[noreturn]] void bad(const std::string& w, const std::string& why) const {
    throw InvalidArgumentError("tp_plan: '" + w + "' is " + style_name(style(w)) + " (rule '" +
                               tp.rule_for(w) + "'), which " + why);
  }
  // A linear on a replicated input; `packed`: a fused weight of stacked parts.
  void input_linear(const std::string& w, bool packed) const {
    TpStyle s = style(w);
    const bool ok = packed ? (replicated(s) || s == TpStyle::kPackedColwise)
                           : s != TpStyle::kEmbeddingRowwise && s != TpStyle::kPackedColwise &&
                                 s != TpStyle::kGroupedGemm;
    if (!ok)
      bad(w, packed ? "does not apply to a packed linear layer; use packed_colwise or replicate"
                    : "does not apply to an unfused linear layer; use one of " +
                          styles_list({TpStyle::kColwise, TpStyle::kRowwise,
                                       TpStyle::kColwiseGatherOutput, TpStyle::kRowwiseSplitInput,
                                       TpStyle::kReplicate}));
    if (splits_input(s)) bad(w, "expects a split input, but its input is replicated");
  }
  // The linear after one whose output is split (or not): it must take what it is given and
  // leave the residual stream whole.
  void output_linear(const std::string& w, bool input_split, const std::string& producers) const {
    input_linear_style(w);
    if (splits_input(style(w)) != input_split)
      bad(w, input_split ? "needs the whole input, but " + producers + " split it; use rowwise"
                         : "expects a split input, but " + producers +
                               " keep it whole; use replicate or rowwise_split_input");
    if (splits_output(style(w))) bad(w, "would leave the residual stream split");
  }
  void input_linear_style(const std::string& w) const {
    TpStyle s = style(w);
    if (s == TpStyle::kEmbeddingRowwise || s == TpStyle::kPackedColwise ||
        s == TpStyle::kGroupedGemm)
      bad(w, "does not apply to a linear layer that consumes another's output");
  }
  void whole(const std::string& w, const char* what) const {
    if (tp.has(w) && !replicated(style(w)))
      bad(w, std::string("cannot split ") + what + "; use replicate");
  }
};

// Gemma 4's per-layer embeddings: the table may be split by rows, as embed_tokens.
void validate_per_layer(const Checker& ck, const PerLayerEmbedding& per_layer,
                        const std::string& base) {
  if (per_layer.dim == 0) return;
  const std::string table = base + ".embed_tokens_per_layer.weight";
  if (!replicated(ck.style(table)) && ck.style(table) != TpStyle::kEmbeddingRowwise)
    ck.bad(table, "does not apply to an embedding; use embedding_rowwise or replicate");
  ck.whole(base + ".per_layer_model_projection.weight", "the per-layer inputs' projection");
  ck.whole(base + ".per_layer_projection_norm.weight", "a norm over features");
}

}  // namespace

void SparseMoE::validate_tp(const TpModel& tp, const std::string& prefix) const {
  Checker ck{tp};
  // Every rank routes every token: the router and its bias are whole.
  const std::string gate = scorer(prefix);
  ck.whole(gate + ".weight", "a router, which scores every expert");
  for (const char* w : {".scale", ".per_expert_scale"})
    ck.whole(prefix + "." + router + w, "a router's scale");
  ck.whole(gate + ".bias", "a router's bias");
  ck.whole(gate + ".e_score_correction_bias", "a router's bias");
  for (const char* w : {".experts.gate_up_proj", ".experts.down_proj"}) {
    const TpStyle s = ck.style(prefix + w);
    if (!replicated(s) && s != TpStyle::kGroupedGemm)
      ck.bad(prefix + w,
             "does not apply to a mixture's experts; use grouped_gemm (the experts "
             "split over ranks) or replicate");
  }
  const std::string gu = prefix + ".experts.gate_up_proj";
  for (const char* w :
       {".experts.down_proj", ".experts.gate_up_proj_bias", ".experts.down_proj_bias"})
    if (tp.has(prefix + w) && ck.style(prefix + w) != ck.style(gu))
      ck.bad(prefix + w,
             "differs from experts.gate_up_proj: a rank's experts need their projections and "
             "biases");
  if (shared) shared->validate_tp(tp, prefix + "." + shared_name);
}

void Attention::validate_tp(const TpModel& tp, const std::string& prefix) const {
  Checker ck{tp};
  const std::string o = prefix + ".o_proj.weight";
  if (qk_norm)
    for (const char* n : {".q_norm.weight", ".k_norm.weight"}) ck.whole(prefix + n, "a norm");
  if (packed_qkv) {
    const std::string qkv = prefix + ".qkv_proj.weight";
    if (!replicated(ck.style(qkv))) ck.bad(qkv, "would split q, k and v unevenly; use replicate");
    ck.output_linear(o, false, "qkv_proj");
    return;
  }
  // A KV-shared layer projects only queries (its keys are another layer's), and k_eq_v has no
  // v_proj: those take k_proj's split.
  const std::string q = prefix + ".q_proj.weight",
                    k = prefix + (kv_source < 0 ? ".k_proj.weight" : ".q_proj.weight"),
                    v = prefix + (kv_source < 0 && !k_eq_v ? ".v_proj.weight" : ".k_proj.weight");
  for (const auto& w : {q, k, v})
    if (tp.has(w)) ck.input_linear(w, false);
  // q, k and v split their heads alike, and o_proj takes what they give.
  const bool split_heads = splits_output(ck.style(q));
  if (splits_output(ck.style(k)) != split_heads ||
      (tp.has(v) && splits_output(ck.style(v)) != split_heads))
    throw InvalidArgumentError("tp_plan: " + prefix +
                               ".{q,k,v}_proj must all split their heads (colwise) or all keep "
                               "them whole; got q_proj " +
                               style_name(ck.style(q)) + ", k_proj " + style_name(ck.style(k)) +
                               ", v_proj " + style_name(ck.style(v)));
  const int P = tp.size();
  if (split_heads && (heads % P || kv_heads % P))
    throw InvalidArgumentError(
        "tp_size " + std::to_string(P) + " does not divide num_key_value_heads " +
        std::to_string(kv_heads) + " (num_attention_heads " + std::to_string(heads) +
        "), so attention heads cannot be split over the ranks (rule '" + tp.rule_for(k) +
        "' is colwise). Replicate attention on every rank and keep the MLP split with "
        "DistributedConfig.tp_plan = {\"layers.*.self_attn.q_proj\": "
        "\"replicated_with_grad_allreduce\", \"layers.*.self_attn.k_proj\": "
        "\"replicated_with_grad_allreduce\", \"layers.*.self_attn.v_proj\": "
        "\"replicated_with_grad_allreduce\", \"layers.*.self_attn.o_proj\": "
        "\"replicated_with_grad_allreduce\"}, "
        "or use a tp_size that divides " +
        std::to_string(kv_heads));
  ck.output_linear(o, split_heads, "q/k/v_proj");
}

void GatedMLP::validate_tp(const TpModel& tp, const std::string& prefix) const {
  Checker ck{tp};
  const std::string d = prefix + ".down_proj.weight";
  if (fused_gate_up) {
    const std::string gu = prefix + ".gate_up_proj.weight";
    ck.input_linear(gu, true);
    ck.output_linear(d, splits_output(ck.style(gu)), "gate_up_proj");
    return;
  }
  const std::string g = prefix + ".gate_proj.weight", u = prefix + ".up_proj.weight";
  for (const auto& w : {g, u}) ck.input_linear(w, false);
  if (splits_output(ck.style(g)) != splits_output(ck.style(u)))
    throw InvalidArgumentError("tp_plan: " + prefix + ".gate_proj and up_proj must be split " +
                               "alike; got " + style_name(ck.style(g)) + " and " +
                               style_name(ck.style(u)));
  ck.output_linear(d, splits_output(ck.style(g)), "gate/up_proj");
}

void DecoderModel::validate_tp(const TpModel& tp) const {
  Checker ck{tp};
  const std::string emb = base + ".embed_tokens.weight";
  if (!replicated(ck.style(emb)) && ck.style(emb) != TpStyle::kEmbeddingRowwise)
    ck.bad(emb, "does not apply to an embedding; use embedding_rowwise or replicate");
  ck.whole(base + ".norm.weight", "a norm over features");
  const std::string head = "lm_head.weight";
  ck.input_linear_style(head);
  if (splits_output(ck.style(head)) || splits_input(ck.style(head)))
    ck.bad(head,
           "would leave the logits split or expect a split input; use colwise_gather_output, "
           "rowwise_split_input or replicate");
  int kv_split = -1;
  for (size_t l = 0; l < blocks.size(); ++l) {
    const DecoderBlock& blk = blocks[l];
    const std::string n = base + ".layers." + std::to_string(l) + ".";
    for (const std::string* norm : {&blk.pre_attn, &blk.post_attn, &blk.pre_mlp, &blk.post_mlp})
      if (!norm->empty()) ck.whole(n + *norm + ".weight", "a norm over features");
    if (blk.linear_attn) {
      // Each rank runs the layer and keeps its whole recurrent state: its projections may be
      // split only with their outputs gathered (Transformers' plan for them), the rest is whole.
      std::vector<WeightSpec> weights;
      blk.linear_attn->declare(weights, n + "linear_attn");
      for (const WeightSpec& w : weights) {
        if (w.role != WeightRole::kLinear) {
          ck.whole(w.name, "a Gated DeltaNet weight other than a projection");
        } else if (tp.has(w.name) && !replicated(ck.style(w.name)) &&
                   ck.style(w.name) != TpStyle::kColwiseGatherOutput) {
          ck.bad(w.name,
                 "does not apply to a Gated DeltaNet projection; use colwise_gather_output (each "
                 "rank keeps the layer's whole state) or replicate");
        }
      }
    } else {
      blk.attn.validate_tp(tp, n + "self_attn");
    }
    if (blk.moe)
      blk.moe->validate_tp(tp, n + "mlp");
    else
      blk.mlp.validate_tp(tp, n + "mlp");
    if (blk.moe_beside) blk.moe_beside->validate_tp(tp, base + ".layers." + std::to_string(l));
    for (const char* w : {"per_layer_input_gate.weight", "per_layer_projection.weight",
                          "post_per_layer_input_norm.weight", "layer_scalar"})
      ck.whole(n + w, "a per-layer input's weights (tformers keeps them whole)");
    // Every attention layer splits its heads, or none does (a KV-shared layer reads another's
    // cache as that layer split it).
    if (blk.linear_attn || blk.attn.kv_source >= 0) continue;
    const int split = blk.attn.cache(&tp, n + "self_attn").kv_heads != blk.attn.kv_heads;
    if (kv_split >= 0 && split != kv_split)
      throw InvalidArgumentError("tp_plan: layers must all split attention heads the same way (" +
                                 n + "self_attn differs from layer 0)");
    kv_split = split;
  }
  validate_per_layer(ck, per_layer, base);
}

}  // namespace tformers::models
