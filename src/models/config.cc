// Reading config.json for the layer library: the fields every decoder shares and RoPE, each
// range-checked before use so that no later size computation can overflow, loop without end or
// silently produce garbage (a negative eps, a zero theta).
#include <algorithm>
#include <cmath>
#include <numbers>
#include <optional>

#include "models/layers.h"
#include "tformers/error.h"

namespace tformers::models {

namespace {

// Bounds on shapes: far above any released model, low enough that products of two of them
// (vocab x hidden, heads x head_dim x hidden) stay well inside int64.
constexpr int64_t kMaxVocab = int64_t(1) << 31;  // ids are int32
constexpr int64_t kMaxWidth = int64_t(1) << 20;  // hidden, intermediate, head_dim
constexpr int64_t kMaxHeads = 4096;
constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxPositions = int64_t(1) << 30;

std::optional<int64_t> longrope_position_limit(const io::Json& j, const std::string& where);

// A field in [lo, hi]; absent or null gives the fallback when there is one.
int64_t int_in(const io::Json& j, const std::string& key, int64_t lo, int64_t hi,
               const std::string& where, std::optional<int64_t> fallback = std::nullopt) {
  return fallback ? io::get_int_in_or(j, key, *fallback, lo, hi, where)
                  : io::get_int_in(j, key, lo, hi, where);
}

}  // namespace

void read_decoder_config(const io::Json& j, const std::string& where, DecoderConfig& c,
                         int64_t head_dim_default, const std::vector<std::string>& acts) {
  c.json = j;
  c.model_type = io::get_or<std::string>(j, "model_type", "", where);
  c.vocab_size = int_in(j, "vocab_size", 1, kMaxVocab - 1, where);
  c.hidden_size = int_in(j, "hidden_size", 1, kMaxWidth, where);
  c.intermediate_size = int_in(j, "intermediate_size", 1, kMaxWidth, where);
  c.num_hidden_layers = int_in(j, "num_hidden_layers", 1, kMaxLayers, where);
  c.num_attention_heads = int_in(j, "num_attention_heads", 1, kMaxHeads, where);
  c.num_key_value_heads =
      int_in(j, "num_key_value_heads", 1, c.num_attention_heads, where, c.num_attention_heads);
  if (c.num_attention_heads % c.num_key_value_heads)
    throw FormatError(where + ": num_attention_heads (" + std::to_string(c.num_attention_heads) +
                      ") must be a multiple of num_key_value_heads (" +
                      std::to_string(c.num_key_value_heads) + ")");
  const int64_t head_dim =
      head_dim_default > 0 ? head_dim_default : c.hidden_size / c.num_attention_heads;
  c.head_dim = int_in(j, "head_dim", 2, kMaxWidth / 4, where, head_dim);
  if (c.head_dim % 2)
    throw FormatError(where + ": head_dim must be even (RoPE rotates pairs), got " +
                      std::to_string(c.head_dim));
  c.max_position_embeddings = int_in(j, "max_position_embeddings", 1, kMaxPositions, where, 2048);
  if (auto limit = longrope_position_limit(j, where))
    c.max_position_embeddings = std::min(c.max_position_embeddings, *limit);
  c.rms_norm_eps = io::get_double_in_or(j, "rms_norm_eps", 1e-6, 1e-12, 1.0, where);
  c.tie_word_embeddings = io::get_or<bool>(j, "tie_word_embeddings", false, where);
  // Transformers 5 writes "dtype" where earlier versions wrote "torch_dtype".
  if (auto d = io::get_optional<std::string>(j, "torch_dtype", where))
    c.torch_dtype = parse_dtype(*d);
  else if (auto d5 = io::get_optional<std::string>(j, "dtype", where))
    c.torch_dtype = parse_dtype(*d5);
  const std::string act = io::get_or<std::string>(j, "hidden_act", acts.front(), where);
  if (std::find(acts.begin(), acts.end(), act) == acts.end()) {
    std::string list;
    for (const auto& a : acts) list += (list.empty() ? "" : ", ") + a;
    throw UnsupportedError(where + ": hidden_act '" + act +
                           "' is not supported by this architecture; supported: " + list);
  }
}

std::pair<int64_t, int64_t> read_expert_counts(const io::Json& j, const std::string& where,
                                               const char* name) {
  const std::optional<int64_t> local =
      io::get_int_in_optional(j, "num_local_experts", 1, 1 << 16, where);
  const int64_t experts = local ? *local : io::get_int_in(j, name, 1, 1 << 16, where);
  return {experts, io::get_int_in(j, "num_experts_per_tok", 1, experts, where)};
}

io::Json nested_text_config(const io::Json& j, const std::string& where) {
  const auto it = j.find("text_config");
  if (it == j.end() || !it->is_object())
    throw FormatError(where + ": the config of a multimodal checkpoint (" +
                      io::get_or<std::string>(j, "model_type", "?", where) +
                      ") needs a text_config object");
  io::Json text = *it;
  for (const char* key : {"tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id",
                          "torch_dtype", "dtype"})
    if (j.contains(key) && !text.contains(key)) text[key] = j[key];
  return text;
}

std::vector<int64_t> read_layer_windows(const io::Json& j, const std::string& where,
                                        std::vector<std::string> types, int64_t window) {
  const size_t layers = types.size();
  if (j.contains("layer_types") && !j["layer_types"].is_null()) {
    const io::Json& list = j["layer_types"];
    if (!list.is_array())
      throw FormatError(where +
                        ": layer_types must be a list of \"full_attention\" or "
                        "\"sliding_attention\"");
    types.clear();
    for (const auto& t : list) types.push_back(t.is_string() ? t.get<std::string>() : t.dump());
    if (types.size() != layers)
      throw FormatError(where + ": layer_types has " + std::to_string(types.size()) +
                        " entries but num_hidden_layers is " + std::to_string(layers));
  }
  std::vector<int64_t> windows;
  for (const std::string& t : types) {
    if (t != "full_attention" && t != "sliding_attention")
      throw FormatError(where +
                        ": layer_types entries must be \"full_attention\" or "
                        "\"sliding_attention\", got \"" +
                        t + "\"");
    if (t == "sliding_attention" && window <= 0)
      throw FormatError(where + ": sliding attention layers need a positive sliding_window, got " +
                        std::to_string(window));
    windows.push_back(t == "sliding_attention" ? window : 0);
  }
  return windows;
}

namespace {

// Transformers 5 saves the RoPE settings as one object, rope_parameters {rope_theta,
// partial_rotary_factor, rope_type, factor, ...}, instead of top-level rope_theta,
// partial_rotary_factor and rope_scaling (which it no longer writes). Returns `j` in the older
// layout, so that both read the same; rope_parameters wins when a config has both, as there.
io::Json with_legacy_rope_fields(const io::Json& j, const std::string& where) {
  auto it = j.find("rope_parameters");
  if (it == j.end() || it->is_null()) return j;
  const io::Json& p = *it;
  if (!p.is_object()) throw FormatError(where + ": rope_parameters must be an object or null");
  for (const char* per_layer : {"full_attention", "sliding_attention"})
    if (p.contains(per_layer))
      throw UnsupportedError(where + ": rope_parameters per layer type ('" + per_layer +
                             "') is only read for Gemma 3; give one rope_parameters object");
  io::Json out = j;
  out.erase("rope_parameters");
  for (const char* key : {"rope_theta", "partial_rotary_factor"})
    if (p.contains(key)) out[key] = p[key];
  // The scaling fields keep their names; rope_scaling's reader ignores rope_theta.
  out["rope_scaling"] = p;
  return out;
}

// inv_freq[i] = 1 / theta^(2i / dim) for i < n, as Transformers computes it in float32 (the
// exponent and the result rounded to float32).
std::vector<double> default_frequencies(double theta, int64_t n, int64_t dim) {
  std::vector<double> inv(static_cast<size_t>(n));
  for (size_t i = 0; i < inv.size(); ++i)
    inv[i] = float(1.0 / std::pow(theta, double(float(2 * i) / float(dim))));
  return inv;
}

// A required positive finite number of rope_scaling.
double positive(const io::Json& rs, const std::string& key, const std::string& w) {
  const double v = io::get_required<double>(rs, key, w);
  if (!(v > 0) || !std::isfinite(v))
    throw FormatError(w + "." + key + " must be a positive number, got " + std::to_string(v));
  return v;
}

void llama3(const io::Json& rs, const std::string& w, double factor, std::vector<double>& inv) {
  const double low = io::get_required<double>(rs, "low_freq_factor", w);
  const double high = io::get_required<double>(rs, "high_freq_factor", w);
  const double old_len = io::get_required<double>(rs, "original_max_position_embeddings", w);
  if (!(high > low) || !(low > 0) || !(old_len > 0))
    throw FormatError(w +
                      ": needs 0 < low_freq_factor < high_freq_factor and a positive "
                      "original_max_position_embeddings");
  const double low_wavelen = old_len / low, high_wavelen = old_len / high;
  for (double& f : inv) {
    const double wavelen = 2 * std::numbers::pi / f;
    if (wavelen > low_wavelen) {
      f = f / factor;
    } else if (wavelen >= high_wavelen) {
      double smooth = (old_len / wavelen - low) / (high - low);
      f = (1 - smooth) * f / factor + smooth * f;
    }
  }
}

// YaRN (arXiv 2309.00071) as Transformers resolves it: frequencies below a correction range are
// interpolated by `factor`, those above kept, a linear ramp between; cos and sin are scaled by
// an attention factor.
void yarn(const io::Json& j, const io::Json& rs, const std::string& where, double theta,
          double factor, RopeConfig& r, std::vector<double>& inv) {
  const std::string w = where + ": rope_scaling";
  const double dim = double(r.rotary_dim);
  const double orig =
      io::get_or<double>(rs, "original_max_position_embeddings",
                         double(io::get_or<int64_t>(j, "max_position_embeddings", 2048, where)), w);
  const double beta_fast = io::get_or<double>(rs, "beta_fast", 32, w);
  const double beta_slow = io::get_or<double>(rs, "beta_slow", 1, w);
  if (!(orig > 0) || !(beta_fast > 0) || !(beta_slow > 0))
    throw FormatError(w +
                      ": original_max_position_embeddings, beta_fast and beta_slow must be "
                      "positive");
  auto mscale = [](double scale, double m) {
    return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
  };
  auto attention = io::get_optional<double>(rs, "attention_factor", w);
  auto ms = io::get_optional<double>(rs, "mscale", w);
  auto ms_all = io::get_optional<double>(rs, "mscale_all_dim", w);
  r.attention_factor = float(attention ? *attention
                                       : (ms && ms_all && *ms != 0 && *ms_all != 0
                                              ? mscale(factor, *ms) / mscale(factor, *ms_all)
                                              : mscale(factor, 1)));
  auto correction_dim = [&](double rotations) {
    return dim * std::log(orig / (rotations * 2 * std::numbers::pi)) / (2 * std::log(theta));
  };
  double low = correction_dim(beta_fast), high = correction_dim(beta_slow);
  if (io::get_or<bool>(rs, "truncate", true, w)) low = std::floor(low), high = std::ceil(high);
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1);
  if (low == high) high += 0.001;  // a ramp of zero width
  for (size_t i = 0; i < inv.size(); ++i) {
    const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
    const double keep = 1 - ramp;  // 1: extrapolate (keep the frequency)
    inv[i] = inv[i] / factor * (1 - keep) + inv[i] * keep;
  }
}

// The pretraining length of a LongRoPE model as Transformers 5 resolves it: the top-level field
// (Phi-3's config.json) first, then rope_scaling's, else max_position_embeddings.
int64_t longrope_original_length(const io::Json& j, const io::Json& rs, const std::string& where) {
  const std::string key = "original_max_position_embeddings";
  if (j.contains(key) && !j[key].is_null()) return io::get_int_in(j, key, 2, kMaxPositions, where);
  return io::get_int_in_or(rs, key, io::get_or<int64_t>(j, "max_position_embeddings", 2048, where),
                           2, kMaxPositions, where + ": rope_scaling");
}

// LongRoPE (Phi-3): each frequency divided by its own short factor; an attention factor from
// the length ratio. Transformers switches to the long factors for a step whose positions pass
// original_max_position_embeddings; read_decoder_config keeps positions below that length (see
// longrope_position_limit), so the short factors are the ones every step uses.
void longrope(const io::Json& j, const io::Json& rs, const std::string& where, double theta,
              RopeConfig& r, std::vector<double>& inv) {
  const std::string w = where + ": rope_scaling";
  const double orig = double(longrope_original_length(j, rs, where));
  for (const char* key : {"long_factor", "short_factor"}) {
    const io::Json list = io::get_required<io::Json>(rs, key, w);
    if (!list.is_array() || list.size() != inv.size())
      throw FormatError(w + "." + key + " must be a list of " + std::to_string(inv.size()) +
                        " numbers (one per rotated pair), got " + list.dump().substr(0, 80));
    for (const io::Json& v : list)
      if (!v.is_number() || !(v.get<double>() > 0) || !std::isfinite(v.get<double>()))
        throw FormatError(w + "." + key + " must hold positive numbers, got " + v.dump());
  }
  // 1 / (short_factor * theta^(2i / dim)), each product rounded to float32 as there.
  const io::Json& shorts = rs["short_factor"];
  const double dim = double(r.rotary_dim);
  for (size_t i = 0; i < inv.size(); ++i) {
    const float wavelength = float(std::pow(theta, double(float(2 * i) / float(dim))));
    inv[i] = float(1.0 / double(float(shorts[i].get<double>()) * wavelength));
  }
  auto factor = io::get_optional<double>(rs, "factor", w);
  const double f =
      factor ? *factor
             : double(io::get_or<int64_t>(j, "max_position_embeddings", 2048, where)) / orig;
  auto attention = io::get_optional<double>(rs, "attention_factor", w);
  r.attention_factor =
      float(attention ? *attention : (f <= 1 ? 1.0 : std::sqrt(1 + std::log(f) / std::log(orig))));
}

// Gemma 4's proportional RoPE: the first partial_rotary_factor of the head's pairs rotate with
// exponents over the whole head_dim, the rest do not rotate (frequency 0), all of the head in
// the rotate-half pairing; every frequency is divided by factor (default 1).
RopeConfig proportional(const io::Json& rs, const std::string& w, int64_t head_dim, double theta,
                        double partial, RopeConfig r) {
  const double factor = rs.contains("factor") ? positive(rs, "factor", w) : 1.0;
  const int64_t rotated = int64_t(std::floor(partial * double(head_dim) / 2));
  std::vector<double> inv = default_frequencies(theta, rotated, head_dim);
  inv.resize(size_t(head_dim / 2), 0.0);
  r.rotary_dim = head_dim;
  for (double f : inv) r.inv_freq.push_back(float(f / factor));
  return r;
}

std::string rope_type(const io::Json& rs, const std::string& w) {
  return rs.contains("rope_type") ? io::get_required<std::string>(rs, "rope_type", w)
                                  : io::get_or<std::string>(rs, "type", "default", w);
}

// The positions read_decoder_config allows a LongRoPE model: its pretraining length (longrope()).
std::optional<int64_t> longrope_position_limit(const io::Json& j, const std::string& where) {
  auto it = j.find("rope_parameters");  // wins over rope_scaling, as in with_legacy_rope_fields
  if (it == j.end() || it->is_null()) it = j.find("rope_scaling");
  if (it == j.end() || !it->is_object() || rope_type(*it, where) != "longrope") return std::nullopt;
  return longrope_original_length(j, *it, where);
}

}  // namespace

RopeConfig read_rope(const io::Json& config, const std::string& where, int64_t head_dim,
                     double theta, bool interleaved) {
  const io::Json j = with_legacy_rope_fields(config, where);
  RopeConfig r;
  r.interleaved = interleaved;
  theta = io::get_positive_finite_or(j, "rope_theta", theta, where);
  const double partial = io::get_or<double>(j, "partial_rotary_factor", 1.0, where);
  if (!(partial > 0 && partial <= 1))
    throw FormatError(where + ": field 'partial_rotary_factor' must be in (0, 1], got " +
                      std::to_string(partial));
  auto it = j.find("rope_scaling");
  const bool scaled = it != j.end() && !it->is_null();
  const std::string w = where + ": rope_scaling";
  if (scaled && !it->is_object()) throw FormatError(w + " must be an object or null");
  const io::Json none = io::Json::object();
  const io::Json& rs = scaled ? *it : none;
  const std::string type = rope_type(rs, w);
  if (type == "proportional") return proportional(rs, w, head_dim, theta, partial, r);
  r.rotary_dim = int64_t(double(head_dim) * partial);
  if (r.rotary_dim < 2 || r.rotary_dim % 2)
    throw FormatError(where + ": partial_rotary_factor " + std::to_string(partial) +
                      " of head_dim " + std::to_string(head_dim) + " rotates " +
                      std::to_string(r.rotary_dim) +
                      " features; it must be a positive even number");
  // Rounded to float32 before any scaling, as there.
  std::vector<double> inv = default_frequencies(theta, r.rotary_dim / 2, r.rotary_dim);
  auto finish = [&] {
    // The attention factor scales q.k as a whole (layers.cc), which equals scaling cos and sin
    // only when every feature rotates.
    if (r.attention_factor != 1 && r.rotary_dim != head_dim)
      throw UnsupportedError(w + ": " + type + " with partial_rotary_factor < 1 is not supported");
    r.inv_freq.assign(inv.begin(), inv.end());
    return r;
  };
  if (type == "default") return finish();
  if (type == "longrope") {
    longrope(j, rs, where, theta, r, inv);
    return finish();
  }
  if (type != "linear" && type != "llama3" && type != "yarn" && type != "dynamic")
    throw UnsupportedError(w + ".rope_type '" + type +
                           "' is not supported: supported types are default, linear, dynamic, "
                           "llama3, yarn, longrope and proportional");
  const double factor = positive(rs, "factor", w);
  if (type == "linear") {
    for (double& f : inv) f /= factor;
  } else if (type == "llama3") {
    llama3(rs, w, factor, inv);
  } else if (type == "yarn") {
    yarn(j, rs, where, theta, factor, r, inv);
  }
  // Dynamic NTK raises theta in Transformers for a step whose positions pass
  // max_position_embeddings and uses the plain frequencies up to it. No step here passes it
  // (generation and serving refuse longer sequences), so the plain ones are those of every
  // step; its factor is checked above all the same.
  return finish();
}

}  // namespace tformers::models
