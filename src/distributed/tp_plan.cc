#include "distributed/tp_plan.h"

#include <algorithm>
#include <set>

#include "tformers/error.h"

namespace tformers::distributed {

namespace {

const std::vector<std::pair<const char*, TpStyle>>& style_table() {
  static const std::vector<std::pair<const char*, TpStyle>> t = {
      {"colwise", TpStyle::kColwise},
      {"rowwise", TpStyle::kRowwise},
      {"colwise_gather_output", TpStyle::kColwiseGatherOutput},
      {"colwise_rep", TpStyle::kColwiseGatherOutput},
      {"rowwise_split_input", TpStyle::kRowwiseSplitInput},
      {"rowwise_rep", TpStyle::kRowwiseSplitInput},
      {"embedding_rowwise", TpStyle::kEmbeddingRowwise},
      {"packed_colwise", TpStyle::kPackedColwise},
      {"replicated_with_grad_allreduce", TpStyle::kReplicatedWithGradAllreduce},
      {"grouped_gemm", TpStyle::kGroupedGemm},
      {"ep_dispatch_experts", TpStyle::kGroupedGemm},
      {"replicate", TpStyle::kReplicate},
      {"local", TpStyle::kReplicate},
  };
  return t;
}

std::vector<std::string> split_dots(const std::string& s) {
  std::vector<std::string> parts;
  size_t b = 0;
  while (true) {
    size_t e = s.find('.', b);
    parts.push_back(s.substr(b, e == std::string::npos ? std::string::npos : e - b));
    if (e == std::string::npos) return parts;
    b = e + 1;
  }
}

bool is_number(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

bool components_match(const std::vector<std::string>& key, const std::vector<std::string>& mod,
                      size_t from) {
  if (mod.size() - from != key.size()) return false;
  for (size_t i = 0; i < key.size(); ++i)
    if (key[i] != "*" && key[i] != mod[from + i]) return false;
  return true;
}

}  // namespace

const char* style_name(TpStyle s) {
  for (const auto& [name, style] : style_table())
    if (style == s) return name;
  return "?";
}

std::string style_names() {
  std::string out;
  for (const auto& [name, style] : style_table())
    out += (out.empty() ? "" : ", ") + std::string(name);
  return out;
}

std::optional<TpStyle> parse_style(const std::string& name) {
  for (const auto& [n, style] : style_table())
    if (name == n) return style;
  return std::nullopt;
}

std::pair<int64_t, int64_t> chunk_range(int64_t n, int rank, int size) {
  TF_CHECK(size >= 1 && rank >= 0 && rank < size && n >= 0, "chunk_range(", n, ", ", rank, ", ",
           size, ")");
  const int64_t chunk = (n + size - 1) / size;
  const int64_t b = std::min(n, chunk * rank), e = std::min(n, chunk * (rank + 1));
  return {b, e};
}

int64_t padded_chunk(int64_t n, int size) {
  TF_CHECK(size >= 1 && n >= 0, "padded_chunk(", n, ", ", size, ")");
  return (n + size - 1) / size;
}

WeightShard shard_for(TpStyle style, const Shape& shape, int rank, int size) {
  WeightShard w;
  w.style = style;
  w.full_shape = shape;
  w.local_shape = shape;
  int dim = -1;
  switch (style) {
    case TpStyle::kReplicate:
    case TpStyle::kReplicatedWithGradAllreduce:
      break;
    case TpStyle::kColwise:
    case TpStyle::kColwiseGatherOutput:
    case TpStyle::kEmbeddingRowwise:
    case TpStyle::kPackedColwise:
    case TpStyle::kGroupedGemm:
      dim = 0;
      break;
    case TpStyle::kRowwise:
    case TpStyle::kRowwiseSplitInput:
      dim = shape.size() >= 2 ? 1 : -1;  // a rowwise bias stays whole
      break;
  }
  if (dim < 0 || size == 1) return w;
  TF_CHECK(int(shape.size()) > dim, "shard_for: shape ", shape_str(shape), " dim ", dim);
  w.dim = dim;
  const int64_t n = shape[size_t(dim)];
  if (style == TpStyle::kPackedColwise) {
    // [gate; up] stacked along rows: rank r holds [gate_r; up_r].
    if (n % 2)
      throw InvalidArgumentError(detail::str_cat(
          "packed_colwise needs an even number of rows (two stacked halves), got ", n));
    const int64_t half = n / 2;
    auto [b, e] = chunk_range(half, rank, size);
    w.ranges = {{b, e}, {half + b, half + e}};
    w.chunk = padded_chunk(half, size);
  } else {
    w.ranges = {chunk_range(n, rank, size)};
    w.chunk = padded_chunk(n, size);
  }
  w.local_shape[size_t(dim)] = w.chunk * int64_t(w.ranges.size());
  return w;
}

bool TpPlan::matches(const std::string& key, const std::string& module) {
  const auto k = split_dots(key), m = split_dots(module);
  if (components_match(k, m, 0)) return true;
  // Keys are relative to the base model: "layers.*" names "model.layers.*".
  return m.size() > 1 && m[0] == "model" && components_match(k, m, 1);
}

std::string TpPlan::key_form(const std::string& module) {
  auto m = split_dots(module);
  size_t from = (m.size() > 1 && m[0] == "model") ? 1 : 0;
  std::string out;
  for (size_t i = from; i < m.size(); ++i)
    out += (out.empty() ? "" : ".") + (is_number(m[i]) ? std::string("*") : m[i]);
  return out;
}

TpPlan::TpPlan(const std::map<std::string, std::string>& defaults,
               const std::map<std::string, std::string>& user,
               const std::vector<std::string>& modules) {
  auto parse = [&](const std::string& key, const std::string& style, const char* whose) {
    auto s = parse_style(style);
    // Transformers' tensor-parallel plan splits each expert's hidden units; tformers splits a
    // mixture by experts, as Transformers' expert-parallel plan does.
    if (!s && style == "moe_tp_experts")
      throw InvalidArgumentError(detail::str_cat(
          "tp_plan", whose, "[\"", key,
          "\"]: moe_tp_experts (each expert's hidden units split over ranks) is not supported; "
          "tformers splits a mixture by experts: use grouped_gemm (or leave the default plan)"));
    if (!s)
      throw InvalidArgumentError(detail::str_cat("tp_plan", whose, "[\"", key,
                                                 "\"]: unknown style '", style,
                                                 "'; valid styles: ", style_names()));
    return *s;
  };
  std::vector<std::pair<std::string, TpStyle>> user_exact, user_glob, def_exact, def_glob;
  for (const auto& [key, style] : user) {
    TpStyle s = parse(key, style, "");
    bool any = std::any_of(modules.begin(), modules.end(),
                           [&, &key = key](const std::string& m) { return matches(key, m); });
    if (!any) {
      std::set<std::string> valid;
      for (const auto& m : modules) valid.insert(key_form(m));
      std::string list;
      for (const auto& v : valid) list += (list.empty() ? "" : ", ") + v;
      throw InvalidArgumentError(detail::str_cat("tp_plan key '", key,
                                                 "' matches no module of this model; valid keys "
                                                 "(`*` for a layer index): ",
                                                 list));
    }
    (key.find('*') == std::string::npos ? user_exact : user_glob).push_back({key, s});
  }
  for (const auto& [key, style] : defaults) {
    if (user.count(key)) continue;  // overridden
    TpStyle s = parse(key, style, " (architecture default)");
    (key.find('*') == std::string::npos ? def_exact : def_glob).push_back({key, s});
  }
  for (auto* v : {&user_exact, &user_glob, &def_exact, &def_glob})
    rules_.insert(rules_.end(), v->begin(), v->end());
}

TpStyle TpPlan::style_of(const std::string& module) const {
  for (const auto& [key, style] : rules_)
    if (matches(key, module)) return style;
  return TpStyle::kReplicate;
}

std::string TpPlan::rule_of(const std::string& module) const {
  for (const auto& [key, style] : rules_)
    if (matches(key, module)) return key;
  return "";
}

}  // namespace tformers::distributed
