#include "tformers/tokenizer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <optional>

#include "core/std_errors.h"
#include "io/file.h"
#include "io/hub.h"
#include "io/json.h"
#include "tformers/error.h"
#include "tokenizer/fast_json.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace tformers {
namespace tokenizer_detail {

// ---------------------------------------------------------------------------------------------
// Added tokens

void AddedTokenTrie::add(const std::string& content, int32_t token_index) {
  if (content.empty()) return;
  int32_t node = 0;
  for (unsigned char c : content) {
    auto& ch = nodes_[node].children;
    auto it = std::lower_bound(ch.begin(), ch.end(), c,
                               [](const auto& p, unsigned char v) { return p.first < v; });
    if (it != ch.end() && it->first == c) {
      node = it->second;
    } else {
      int32_t n = static_cast<int32_t>(nodes_.size());
      ch.insert(it, {c, n});
      nodes_.emplace_back();
      node = n;
    }
  }
  if (nodes_[node].token < 0) nodes_[node].token = token_index;  // first definition wins
  first_byte_[static_cast<unsigned char>(content[0])] = true;
}

void AddedTokenTrie::find(std::string_view text,
                          std::vector<std::tuple<size_t, size_t, int32_t>>& out) const {
  out.clear();
  if (empty()) return;
  size_t i = 0;
  while (i < text.size()) {
    if (!first_byte_[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    int32_t node = 0;
    int32_t best = -1;
    size_t best_end = 0;
    for (size_t k = i; k < text.size(); ++k) {
      const auto& ch = nodes_[node].children;
      unsigned char c = static_cast<unsigned char>(text[k]);
      auto it = std::lower_bound(ch.begin(), ch.end(), c,
                                 [](const auto& p, unsigned char v) { return p.first < v; });
      if (it == ch.end() || it->first != c) break;
      node = it->second;
      if (nodes_[node].token >= 0) {
        best = nodes_[node].token;
        best_end = k + 1;
      }
    }
    if (best >= 0) {
      out.emplace_back(i, best_end, best);
      i = best_end;
    } else {
      ++i;
    }
  }
}

namespace {

bool is_word_char(char32_t c) { return c == '_' || is_alphanumeric(c); }

char32_t last_code_point(std::string_view s) {
  size_t k = s.size() - 1;
  while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
  return next_code_point(s, k);
}

struct Segment {
  std::string text;
  int32_t id;     // added token id, or -1 for text still to tokenize
  bool at_start;  // starts at offset 0 of the input
};

// The Rust library's AddedVocabulary::split_with_indices: cuts `text` around added tokens,
// honouring single_word, lstrip and rstrip.
void split_added(const AddedTokenTrie& trie, const std::vector<AddedToken>& tokens,
                 const std::string& text, bool at_start, std::vector<Segment>& out) {
  std::vector<std::tuple<size_t, size_t, int32_t>> matches;
  trie.find(text, matches);
  if (matches.empty()) {
    out.push_back({text, -1, at_start});
    return;
  }
  size_t start_offset = 0;
  for (auto [mb, me, index] : matches) {
    const AddedToken& t = tokens[index];
    size_t start = mb, stop = me;
    if (start < start_offset) continue;  // swallowed by a previous rstrip
    if (t.single_word) {
      bool start_space =
          start == 0 || !is_word_char(last_code_point(std::string_view(text).substr(0, start)));
      bool stop_space = true;
      if (stop < text.size()) {
        size_t k = stop;
        stop_space = !is_word_char(next_code_point(text, k));
      }
      if (!start_space || !stop_space) continue;
    }
    if (t.lstrip) {
      size_t s = start;
      while (s > 0) {
        size_t k = s - 1;
        while (k > 0 && (static_cast<unsigned char>(text[k]) & 0xC0) == 0x80) --k;
        size_t j = k;
        if (!is_whitespace(next_code_point(text, j))) break;
        s = k;
      }
      start = std::max(s, start_offset);
    }
    if (t.rstrip) {
      while (stop < text.size()) {
        size_t j = stop;
        if (!is_whitespace(next_code_point(text, j))) break;
        stop = j;
      }
    }
    if (start_offset < start) {
      out.push_back(
          {text.substr(start_offset, start - start_offset), -1, at_start && start_offset == 0});
    }
    out.push_back({text.substr(start, stop - start), t.id, at_start && start == 0});
    start_offset = stop;
  }
  if (start_offset < text.size()) {
    out.push_back({text.substr(start_offset), -1, at_start && start_offset == 0});
  }
}

}  // namespace

std::vector<int32_t> TokenizerImpl::encode_raw(std::string_view input) const {
  std::string text = is_valid_utf8(input) ? std::string(input) : repair_utf8(input);
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (text.empty()) return ids;

  std::vector<Segment> first, second;
  split_added(raw_trie, added_tokens, text, true, first);
  for (Segment& seg : first) {
    if (seg.id >= 0) {
      second.push_back(std::move(seg));
      continue;
    }
    if (normalizer) normalizer->normalize(seg.text, GrowthBudget(seg.text.size()));
    if (seg.text.empty()) continue;
    split_added(normalized_trie, added_tokens, seg.text, seg.at_start, second);
  }
  std::vector<std::string> splits;
  for (Segment& seg : second) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    GrowthBudget budget(seg.text.size());
    splits.clear();
    splits.push_back(std::move(seg.text));
    bool at_start = seg.at_start;
    if (pre_tokenizer) pre_tokenizer->pre_tokenize(splits, at_start, budget);
    for (const std::string& w : splits) model->tokenize(w, ids);
  }
  return ids;
}

std::string TokenizerImpl::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  // As the Rust library: every token (added ones included) goes through the decoder chain;
  // without a decoder the tokens are joined with spaces. Unknown ids are dropped.
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    auto it = added_by_id.find(id);
    if (it != added_by_id.end()) {
      const AddedToken& t = added_tokens[it->second];
      if (skip_special_tokens && t.special) continue;
      tokens.push_back(t.content);
    } else if (std::string_view tok; model->id_to_token(id, tok)) {
      tokens.emplace_back(tok);
    }
  }
  std::string result;
  if (decoder) {
    decoder->decode_chain(tokens);
    for (auto& t : tokens) result += t;
  } else {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i) result += ' ';
      result += tokens[i];
    }
  }
  return result;
}

std::optional<std::string> TokenizerImpl::token_bytes(int32_t id) const {
  if (added_by_id.count(id)) return std::nullopt;
  std::string_view tok;
  if (!model->id_to_token(id, tok)) return std::nullopt;
  std::string bytes(tok);
  if (decoder) decoder->raw_token(bytes);
  return bytes;
}

std::optional<int32_t> TokenizerImpl::token_to_id(std::string_view token) const {
  auto it = added_by_content.find(std::string(token));
  if (it != added_by_content.end()) return it->second;
  int32_t id = model->token_to_id(token);
  if (id >= 0) return id;
  return std::nullopt;
}

namespace {

// The file's bytes, mapped read-only when possible: page-cache pages are shared instead of
// copied into freshly faulted memory (a tenth of the load time for Qwen3's 11 MB file).
class FileBytes {
 public:
  explicit FileBytes(const std::string& path) {
    io::RegularFile file(path, io::kMaxTokenizerJsonBytes, "tokenizer file");
    if (file.size() > 0) {
      void* p = ::mmap(nullptr, file.size(), PROT_READ, MAP_PRIVATE, file.fd(), 0);
      if (p != MAP_FAILED) {
        data_ = p;
        size_ = file.size();
      }
    }
    if (!data_) fallback_ = file.read_all();
  }
  ~FileBytes() {
    if (data_) ::munmap(data_, size_);
  }
  FileBytes(const FileBytes&) = delete;
  FileBytes& operator=(const FileBytes&) = delete;
  std::string_view view() const {
    return data_ ? std::string_view(static_cast<const char*>(data_), size_) : fallback_;
  }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
  std::string fallback_;
};

std::unique_ptr<TokenizerImpl> build(std::string_view text, const std::string& where) {
  TokenizerJson tj = parse_tokenizer_json(text, where);
  const Json& doc = tj.doc;
  std::string root = where + ": ";
  if (!doc.is_object()) throw FormatError(where + ": the top level must be a JSON object");
  auto impl = std::make_unique<TokenizerImpl>();

  const Json& model = member(doc, "model", where + ":");
  std::string mpath = root + "model";
  std::string mtype = model.is_object() && model.contains("type") && model["type"].is_string()
                          ? model["type"].get<std::string>()
                          : (tj.has_merges ? "BPE" : "");
  if (mtype != "BPE") {
    throw UnsupportedError(
        detail::str_cat(mpath, ".type: unsupported model type '", mtype, "'; supported: BPE"));
  }
  if (!tj.has_vocab) {
    throw FormatError(mpath + ".vocab is missing or not an object {token: id}");
  }
  if (!tj.has_merges) throw FormatError(mpath + ".merges is missing or not an array");
  BpeOptions opt;
  auto opt_string = [&](const char* key) -> std::optional<std::string> {
    auto it = model.find(key);
    if (it == model.end() || it->is_null()) return std::nullopt;
    if (!it->is_string()) {
      throw FormatError(
          detail::str_cat(mpath, ".", key, " must be a string or null, got ", it->type_name()));
    }
    return it->get<std::string>();
  };
  opt.unk_token = opt_string("unk_token");
  opt.continuing_subword_prefix = opt_string("continuing_subword_prefix").value_or("");
  opt.end_of_word_suffix = opt_string("end_of_word_suffix").value_or("");
  opt.fuse_unk = get_bool(model, "fuse_unk", mpath, false);
  opt.byte_fallback = get_bool(model, "byte_fallback", mpath, false);
  opt.ignore_merges = get_bool(model, "ignore_merges", mpath, false);
  if (model.contains("dropout") && model["dropout"].is_number() &&
      model["dropout"].get<double>() > 0) {
    throw UnsupportedError(mpath + ".dropout: BPE dropout is not supported (set it to null)");
  }
  impl->model = std::make_unique<BpeModel>(tj.vocab, tj.merges, std::move(opt), where);

  auto get_component = [&](const char* key) -> const Json& {
    static const Json null_json;
    auto it = doc.find(key);
    return it == doc.end() ? null_json : *it;
  };
  impl->normalizer = make_normalizer(get_component("normalizer"), root + "normalizer");
  impl->pre_tokenizer = make_pre_tokenizer(get_component("pre_tokenizer"), root + "pre_tokenizer");
  impl->post_processor =
      make_post_processor(get_component("post_processor"), root + "post_processor");
  impl->decoder = make_decoder(get_component("decoder"), root + "decoder");

  const Json& added = get_component("added_tokens");
  if (!added.is_null() && !added.is_array()) {
    throw FormatError(root + "added_tokens must be an array");
  }
  for (size_t i = 0; added.is_array() && i < added.size(); ++i) {
    std::string p = detail::str_cat(root, "added_tokens[", i, "]");
    const Json& a = added[i];
    AddedToken t;
    t.content = get_string(a, "content", p);
    const Json& id = member(a, "id", p);
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
      throw FormatError(p + ".id must be a non-negative integer");
    }
    t.id = id.get<int32_t>();
    // Tokenizer::vocab_size() counts up to the largest id, and callers size tables by it.
    if (uint64_t(t.id) >= impl->model->max_id_plus_one() + added.size() + kMaxVocabIdGap) {
      throw FormatError(detail::str_cat(p, ".id = ", t.id, " is far above the vocabulary's ",
                                        impl->model->max_id_plus_one(),
                                        " ids; added token ids must follow the vocabulary's"));
    }
    t.special = get_bool(a, "special", p, false);
    t.lstrip = get_bool(a, "lstrip", p, false);
    t.rstrip = get_bool(a, "rstrip", p, false);
    t.normalized = get_bool(a, "normalized", p, !t.special);
    t.single_word = get_bool(a, "single_word", p, false);
    int32_t index = static_cast<int32_t>(impl->added_tokens.size());
    (t.normalized ? impl->normalized_trie : impl->raw_trie).add(t.content, index);
    impl->added_by_id[t.id] = impl->added_tokens.size();
    impl->added_by_content.emplace(t.content, t.id);
    impl->added_tokens.push_back(std::move(t));
  }
  return impl;
}

std::string token_string(const Json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return v["content"].get<std::string>();
  }
  return "";
}

void apply_config(TokenizerImpl& impl, const Json& cfg, const std::string& where) {
  impl.config = cfg;
  if (!cfg.is_object()) throw FormatError(where + ": the top level must be a JSON object");
  auto tok = [&](const char* key) { return cfg.contains(key) ? token_string(cfg[key]) : ""; };
  impl.bos_token = tok("bos_token");
  impl.eos_token = tok("eos_token");
  impl.pad_token = tok("pad_token");
  impl.unk_token = tok("unk_token");
  if (cfg.contains("model_max_length") && cfg["model_max_length"].is_number()) {
    double m = cfg["model_max_length"].get<double>();
    impl.model_max_length = m >= 9.0e18 ? INT64_MAX : static_cast<int64_t>(m);
  }
  auto side = [&](const char* key, std::string& dst) {
    if (!cfg.contains(key)) return;
    if (!cfg[key].is_string() || (cfg[key] != "left" && cfg[key] != "right")) {
      throw FormatError(detail::str_cat(where, ": ", key, " must be \"left\" or \"right\""));
    }
    dst = cfg[key].get<std::string>();
  };
  side("padding_side", impl.padding_side);
  side("truncation_side", impl.truncation_side);
  if (cfg.contains("chat_template")) {
    const Json& ct = cfg["chat_template"];
    if (ct.is_string()) {
      impl.chat_template = ct.get<std::string>();
    } else if (ct.is_array()) {
      // Named templates [{"name": "default", "template": ...}]: use "default".
      for (const Json& t : ct) {
        if (t.is_object() && t.value("name", "") == "default" && t.contains("template")) {
          impl.chat_template = t["template"].get<std::string>();
        }
      }
    }
  }
  if (cfg.contains("clean_up_tokenization_spaces") &&
      cfg["clean_up_tokenization_spaces"].is_boolean()) {
    impl.clean_up_tokenization_spaces = cfg["clean_up_tokenization_spaces"].get<bool>();
  }
  // Transformers' LlamaTokenizerFast and GemmaTokenizerFast rebuild the post-processor from
  // add_bos_token / add_eos_token (update_post_processor) instead of keeping tokenizer.json's.
  std::string cls = cfg.value("tokenizer_class", "");
  bool llama_like = cls.rfind("LlamaTokenizer", 0) == 0 || cls.rfind("GemmaTokenizer", 0) == 0 ||
                    cls.rfind("CodeLlamaTokenizer", 0) == 0;
  if (llama_like && (cfg.contains("add_bos_token") || cfg.contains("add_eos_token"))) {
    bool add_bos = cfg.value("add_bos_token", true);
    bool add_eos = cfg.value("add_eos_token", false);
    std::vector<int32_t> bos, eos;
    if (add_bos) {
      auto id = impl.token_to_id(impl.bos_token);
      if (!id)
        throw FormatError(where + ": add_bos_token is set but bos_token is not in the vocab");
      bos.push_back(*id);
    }
    if (add_eos) {
      auto id = impl.token_to_id(impl.eos_token);
      if (!id)
        throw FormatError(where + ": add_eos_token is set but eos_token is not in the vocab");
      eos.push_back(*id);
    }
    impl.post_processor = make_bos_eos_processor(bos, eos);
  }
}

std::string clean_up_tokenization(std::string s) {
  static const std::pair<const char*, const char*> kRules[] = {
      {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (auto [from, to] : kRules) {
    std::string out;
    size_t prev = 0, pos;
    std::string_view f(from);
    while ((pos = s.find(f, prev)) != std::string::npos) {
      out.append(s, prev, pos - prev);
      out += to;
      prev = pos + f.size();
    }
    out.append(s, prev, std::string::npos);
    s.swap(out);
  }
  return s;
}

}  // namespace
}  // namespace tokenizer_detail

using tokenizer_detail::TokenizerImpl;

Tokenizer::Tokenizer(std::unique_ptr<TokenizerImpl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_file(const std::string& path) {
  return detail::with_tformers_errors(detail::str_cat("loading ", path), [&] {
    tokenizer_detail::FileBytes bytes(path);
    return Tokenizer(tokenizer_detail::build(bytes.view(), path));
  });
}

Tokenizer Tokenizer::from_json_string(std::string_view json_text, const std::string& where) {
  return detail::with_tformers_errors(detail::str_cat("loading ", where), [&] {
    return Tokenizer(tokenizer_detail::build(json_text, where));
  });
}

// A chat template is a few KB; this bounds what a stranger's file can make us read.
constexpr uint64_t kMaxChatTemplateBytes = uint64_t(16) << 20;

Tokenizer AutoTokenizer::from_pretrained(const std::string& id_or_path,
                                         const std::string& revision) {
  namespace fs = std::filesystem;
  return detail::with_tformers_errors(
      detail::str_cat("loading the tokenizer of ", id_or_path), [&] {
        std::string dir = io::resolve_model_path(id_or_path, revision);
        std::string tj = (fs::path(dir) / "tokenizer.json").string();
        std::error_code ec;
        if (!fs::exists(tj, ec))
          throw NotFoundError(detail::str_cat(dir,
                                              " has no tokenizer.json (only tokenizer.json-based "
                                              "tokenizers are supported; convert a "
                                              "SentencePiece model with Transformers first)"));
        Tokenizer tok = Tokenizer::from_file(tj);
        tok.impl_->folder = dir;
        std::string cfg = (fs::path(dir) / "tokenizer_config.json").string();
        if (fs::exists(cfg, ec))
          tokenizer_detail::apply_config(*tok.impl_, io::load_json_file(cfg), cfg);
        // What newer Hub checkpoints ship, and Transformers 5 saves: the template as its own
        // file, which takes priority over tokenizer_config.json's chat_template (as in
        // PreTrainedTokenizerBase._from_pretrained).
        std::string jinja = (fs::path(dir) / "chat_template.jinja").string();
        if (fs::exists(jinja, ec))
          tok.impl_->chat_template =
              io::read_regular_file(jinja, kMaxChatTemplateBytes, "chat template file");
        return tok;
      });
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  return impl_->post_processor->process(impl_->encode_raw(text), nullptr, add_special_tokens);
}

std::vector<int32_t> Tokenizer::encode_pair(std::string_view text, std::string_view pair,
                                            bool add_special_tokens) const {
  std::vector<int32_t> b = impl_->encode_raw(pair);
  return impl_->post_processor->process(impl_->encode_raw(text), &b, add_special_tokens);
}

std::vector<std::string> Tokenizer::tokenize(std::string_view text, bool add_special_tokens) const {
  return convert_ids_to_tokens(encode(text, add_special_tokens));
}

std::string Tokenizer::decode(std::span<const int32_t> ids, const DecodeOptions& options) const {
  std::string s = impl_->decode(ids, options.skip_special_tokens);
  if (options.clean_up_tokenization_spaces.value_or(impl_->clean_up_tokenization_spaces)) {
    s = tokenizer_detail::clean_up_tokenization(std::move(s));
  }
  return s;
}

std::vector<std::string> Tokenizer::batch_decode(const std::vector<std::vector<int32_t>>& ids,
                                                 const DecodeOptions& options) const {
  std::vector<std::string> out;
  out.reserve(ids.size());
  for (const auto& v : ids) out.push_back(decode(v, options));
  return out;
}

BatchEncoding Tokenizer::operator()(const std::vector<std::string>& texts,
                                    const CallOptions& options) const {
  std::string side = options.padding_side.value_or(impl_->padding_side);
  if (side != "left" && side != "right") {
    throw InvalidArgumentError(
        detail::str_cat("padding_side must be \"left\" or \"right\", got \"", side, "\""));
  }
  std::string truncation_side = options.truncation_side.value_or(impl_->truncation_side);
  if (truncation_side != "left" && truncation_side != "right") {
    throw InvalidArgumentError(detail::str_cat(
        "truncation_side must be \"left\" or \"right\", got \"", truncation_side, "\""));
  }
  std::optional<int64_t> max_length = options.max_length;
  if (!max_length && (options.truncation || options.padding == PaddingStrategy::kMaxLength)) {
    if (impl_->model_max_length == INT64_MAX) {
      throw InvalidArgumentError(
          "max_length is needed: this tokenizer has no model_max_length in "
          "tokenizer_config.json; pass CallOptions::max_length");
    }
    max_length = impl_->model_max_length;
  }
  if (max_length && *max_length <= 0) {
    throw InvalidArgumentError(detail::str_cat("max_length must be positive, got ", *max_length));
  }
  BatchEncoding out;
  size_t added = options.add_special_tokens ? impl_->post_processor->added_tokens(false) : 0;
  for (const std::string& text : texts) {
    std::vector<int32_t> ids = impl_->encode_raw(text);
    if (options.truncation) {
      if (static_cast<int64_t>(added) >= *max_length) {
        throw InvalidArgumentError(
            detail::str_cat("max_length ", *max_length, " leaves no room for text after the ",
                            added, " special tokens the post-processor adds; raise max_length"));
      }
      size_t keep = static_cast<size_t>(*max_length) - added;
      if (ids.size() > keep) {
        if (truncation_side == "left") {
          ids.erase(ids.begin(), ids.end() - static_cast<std::ptrdiff_t>(keep));
        } else {
          ids.resize(keep);
        }
      }
    }
    out.input_ids.push_back(
        impl_->post_processor->process(std::move(ids), nullptr, options.add_special_tokens));
    out.attention_mask.emplace_back(out.input_ids.back().size(), 1);
  }
  if (options.padding != PaddingStrategy::kDoNotPad && !texts.empty()) {
    size_t target = 0;
    if (options.padding == PaddingStrategy::kLongest) {
      for (auto& v : out.input_ids) target = std::max(target, v.size());
    } else {
      target = static_cast<size_t>(*max_length);
    }
    if (options.pad_to_multiple_of && *options.pad_to_multiple_of > 0) {
      size_t m = static_cast<size_t>(*options.pad_to_multiple_of);
      target = (target + m - 1) / m * m;
    }
    auto pad_id = pad_token_id();
    if (!pad_id) {
      throw InvalidArgumentError(
          "asking to pad but the tokenizer has no pad_token; set pad_token in "
          "tokenizer_config.json (for example to the eos_token)");
    }
    for (size_t b = 0; b < out.input_ids.size(); ++b) {
      auto& ids = out.input_ids[b];
      auto& mask = out.attention_mask[b];
      if (ids.size() >= target) continue;
      size_t n = target - ids.size();
      if (side == "left") {
        ids.insert(ids.begin(), n, *pad_id);
        mask.insert(mask.begin(), n, 0);
      } else {
        ids.insert(ids.end(), n, *pad_id);
        mask.insert(mask.end(), n, 0);
      }
    }
  }
  return out;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  return impl_->token_to_id(token);
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  auto it = impl_->added_by_id.find(id);
  if (it != impl_->added_by_id.end()) return impl_->added_tokens[it->second].content;
  if (std::string_view t; impl_->model->id_to_token(id, t)) return std::string(t);
  return std::nullopt;
}

std::optional<std::string> Tokenizer::token_bytes(int32_t id) const {
  return impl_->token_bytes(id);
}

std::vector<std::string> Tokenizer::convert_ids_to_tokens(std::span<const int32_t> ids) const {
  std::vector<std::string> out;
  out.reserve(ids.size());
  for (int32_t id : ids) out.push_back(id_to_token(id).value_or(""));
  return out;
}

size_t Tokenizer::vocab_size() const {
  size_t n = impl_->model->max_id_plus_one();
  for (const auto& t : impl_->added_tokens) n = std::max(n, static_cast<size_t>(t.id) + 1);
  return n;
}

bool Tokenizer::is_special_id(int32_t id) const {
  auto it = impl_->added_by_id.find(id);
  return it != impl_->added_by_id.end() && impl_->added_tokens[it->second].special;
}

size_t Tokenizer::num_special_tokens_to_add(bool pair) const {
  return impl_->post_processor->added_tokens(pair);
}

const std::string& Tokenizer::bos_token() const { return impl_->bos_token; }
const std::string& Tokenizer::eos_token() const { return impl_->eos_token; }
const std::string& Tokenizer::pad_token() const { return impl_->pad_token; }
const std::string& Tokenizer::unk_token() const { return impl_->unk_token; }
static std::optional<int32_t> id_of(const TokenizerImpl& impl, const std::string& token) {
  if (token.empty()) return std::nullopt;
  return impl.token_to_id(token);
}
std::optional<int32_t> Tokenizer::bos_token_id() const { return id_of(*impl_, impl_->bos_token); }
std::optional<int32_t> Tokenizer::eos_token_id() const { return id_of(*impl_, impl_->eos_token); }
std::optional<int32_t> Tokenizer::pad_token_id() const { return id_of(*impl_, impl_->pad_token); }
std::optional<int32_t> Tokenizer::unk_token_id() const { return id_of(*impl_, impl_->unk_token); }
int64_t Tokenizer::model_max_length() const { return impl_->model_max_length; }
const std::string& Tokenizer::padding_side() const { return impl_->padding_side; }
void Tokenizer::set_padding_side(const std::string& side) {
  if (side != "left" && side != "right") {
    throw InvalidArgumentError(
        detail::str_cat("padding_side must be \"left\" or \"right\", got \"", side, "\""));
  }
  impl_->padding_side = side;
}
void Tokenizer::set_pad_token(const std::string& token) {
  if (!impl_->token_to_id(token)) {
    throw InvalidArgumentError(
        detail::str_cat("pad_token \"", token, "\" is not in the vocabulary; add it first"));
  }
  impl_->pad_token = token;
}
const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }
void Tokenizer::set_chat_template(std::string chat_template) {
  impl_->chat_template = std::move(chat_template);
}
const nlohmann::json& Tokenizer::config() const { return impl_->config; }
const std::string& Tokenizer::folder() const { return impl_->folder; }

// ---------------------------------------------------------------------------------------------
// Streaming

TokenStreamer::TokenStreamer(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(&tokenizer), skip_special_tokens_(skip_special_tokens) {}

std::string TokenStreamer::put(int32_t id) {
  ids_.push_back(id);
  DecodeOptions opt{.skip_special_tokens = skip_special_tokens_,
                    .clean_up_tokenization_spaces = false};
  std::string text = tokenizer_->decode(ids_, opt);
  // Hold back while the tail is an incomplete character (decoded as U+FFFD) or while the text
  // has not grown past what was already emitted.
  if (text.size() <= prefix_text_.size()) return "";
  if (text.size() >= 3 && text.compare(text.size() - 3, 3, "\xEF\xBF\xBD") == 0) return "";
  if (text.compare(0, prefix_text_.size(), prefix_text_) != 0) {
    // The decoder rewrote earlier text (rare); emit nothing until it settles.
    return "";
  }
  std::string out = text.substr(prefix_text_.size());
  // Keep the last ids as context for decoders that look at neighbours (Metaspace, Strip).
  ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(prefix_ids_));
  prefix_ids_ = ids_.size();
  prefix_text_ = tokenizer_->decode(ids_, opt);
  return out;
}

std::string TokenStreamer::end() {
  DecodeOptions opt{.skip_special_tokens = skip_special_tokens_,
                    .clean_up_tokenization_spaces = false};
  std::string text = tokenizer_->decode(ids_, opt);
  std::string out =
      text.size() > prefix_text_.size() && text.compare(0, prefix_text_.size(), prefix_text_) == 0
          ? text.substr(prefix_text_.size())
          : "";
  ids_.clear();
  prefix_ids_ = 0;
  prefix_text_.clear();
  return out;
}

}  // namespace tformers
