#include "generation/token_matcher.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <numeric>
#include <tuple>

#include "tformers/error.h"
#include "tformers/tokenizer.h"

namespace tformers::generation {

TokenVocabulary::TokenVocabulary(const Tokenizer& tokenizer, int64_t vocab_size) {
  TF_CHECK(vocab_size > 0, "vocab_size ", vocab_size);
  bytes_.resize(size_t(vocab_size));
  const int64_t known = std::min<int64_t>(vocab_size, int64_t(tokenizer.vocab_size()));
  for (int64_t id = 0; id < known; ++id) bytes_[size_t(id)] = tokenizer.token_bytes(int32_t(id));
  build();
}

TokenVocabulary::TokenVocabulary(std::vector<std::optional<std::string>> bytes)
    : bytes_(std::move(bytes)) {
  build();
}

void TokenVocabulary::build() {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < bytes_.size(); ++i)
    if (bytes_[i] && !bytes_[i]->empty()) {
      ids.push_back(int32_t(i));
      max_bytes_ = std::max(max_bytes_, bytes_[i]->size());
    }
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    return std::tie(*bytes_[size_t(a)], a) < std::tie(*bytes_[size_t(b)], b);
  });
  // Breadth first, so that each node's children are contiguous: (node, ids [lo, hi), depth).
  nodes_.assign(1, Node{});
  std::deque<std::tuple<int32_t, size_t, size_t, size_t>> todo = {{0, 0, ids.size(), 0}};
  while (!todo.empty()) {
    auto [node, lo, hi, depth] = todo.front();
    todo.pop_front();
    // The tokens that end here sort first (a prefix before its extensions).
    nodes_[size_t(node)].first_token = int32_t(tokens_.size());
    while (lo < hi && bytes_[size_t(ids[lo])]->size() == depth) tokens_.push_back(ids[lo++]);
    nodes_[size_t(node)].end_token = int32_t(tokens_.size());
    nodes_[size_t(node)].first_child = int32_t(nodes_.size());
    for (size_t i = lo; i < hi;) {
      const uint8_t b = uint8_t((*bytes_[size_t(ids[i])])[depth]);
      size_t j = i;
      while (j < hi && uint8_t((*bytes_[size_t(ids[j])])[depth]) == b) ++j;
      Node child;
      child.byte = b;
      nodes_.push_back(child);
      todo.emplace_back(int32_t(nodes_.size() - 1), i, j, depth + 1);
      i = j;
    }
    nodes_[size_t(node)].end_child = int32_t(nodes_.size());
  }
}

TokenMatcher::TokenMatcher(std::shared_ptr<const JsonGrammar> grammar,
                           std::shared_ptr<const TokenVocabulary> vocabulary,
                           std::vector<int64_t> stop_ids)
    : grammar_(std::move(grammar)), vocab_(std::move(vocabulary)), bytes_(grammar_) {
  TF_CHECK(vocab_, "TokenMatcher: no vocabulary");
  for (int64_t id : stop_ids)
    if (id >= 0 && id < vocab_->size()) stop_ids_.push_back(int32_t(id));
  levels_.resize(vocab_->max_token_bytes() + 1);
}

void TokenMatcher::allowed(std::vector<uint64_t>& bits) const {
  const int64_t V = vocab_->size();
  bits.assign(size_t((V + 63) / 64), 0);
  auto allow = [&](int32_t id) { bits[size_t(id) / 64] |= uint64_t(1) << (id % 64); };
  if (accepting())
    for (int32_t id : stop_ids_) allow(id);
  if (finished()) return;
  const auto& nodes = vocab_->nodes();
  const auto& tokens = vocab_->tokens();
  const JsonGrammar& g = *grammar_;
  // Inside a plain string (the usual case of a long mask: most tokens fit), a level is the
  // string's frame alone until a quote closes it; then the whole state again, every parse put
  // at that place in its string.
  int64_t min_len = 0, max_len = 0;
  const bool in_string = JsonMatcher::plain_string(g, bytes_.state(), min_len, max_len);
  if (in_string) base_ = bytes_.state();
  levels_[0].lite = in_string;
  if (in_string)
    levels_[0].top = bytes_.state().frames.back();
  else
    levels_[0].full = bytes_.state();
  // Depth-first over the trie; a child whose byte the matcher refuses is cut with all below it.
  struct Item {
    int32_t node, child;
  };
  thread_local std::vector<Item> path;
  path.clear();
  path.push_back({0, nodes[0].first_child});
  while (!path.empty()) {
    Item& it = path.back();
    if (it.child == nodes[size_t(it.node)].end_child) {
      path.pop_back();
      continue;
    }
    const int32_t ch = it.child++;
    const size_t level = path.size();
    const TokenVocabulary::Node& n = nodes[size_t(ch)];
    const Level& from = levels_[level - 1];
    Level& to = levels_[level];
    if (from.lite) {
      to.top = from.top;
      switch (JsonMatcher::string_step(to.top, n.byte, min_len, max_len)) {
        case JsonMatcher::StringStep::kReject:
          continue;
        case JsonMatcher::StringStep::kInside:
          to.lite = true;
          break;
        case JsonMatcher::StringStep::kClose:
          to.lite = false;
          JsonMatcher::set_string_place(base_, from.top);
          JsonMatcher::step(g, base_, n.byte, to.full);
          if (to.full.empty()) continue;
          break;
      }
    } else {
      to.lite = false;
      JsonMatcher::step(g, from.full, n.byte, to.full);
      if (to.full.empty()) continue;
    }
    for (int32_t t = n.first_token; t < n.end_token; ++t) allow(tokens[size_t(t)]);
    if (n.first_child < n.end_child) path.push_back({ch, n.first_child});
  }
}

void TokenMatcher::apply(std::span<float> scores) const {
  TF_CHECK(int64_t(scores.size()) == vocab_->size(), "TokenMatcher: ", scores.size(),
           " scores for a vocabulary of ", vocab_->size());
  allowed(bits_);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (size_t w = 0; w < bits_.size(); ++w) {
    const uint64_t word = bits_[w];
    if (word == ~uint64_t(0)) continue;
    const size_t end = std::min(scores.size(), (w + 1) * 64);
    for (size_t i = w * 64; i < end; ++i)
      if (!(word >> (i % 64) & 1)) scores[i] = kNegInf;
  }
}

bool TokenMatcher::accept(int32_t token) {
  if (ended_ || token < 0 || token >= vocab_->size()) return false;
  if (std::find(stop_ids_.begin(), stop_ids_.end(), token) != stop_ids_.end()) {
    if (!bytes_.accepting()) return false;
    ended_ = true;
    ++accepted_;
    return true;
  }
  const auto& b = vocab_->bytes(token);
  if (!b || b->empty() || !bytes_.advance(*b)) return false;
  ++accepted_;
  return true;
}

void TokenMatcher::sync(std::span<const int32_t> generated) {
  TF_CHECK(int64_t(generated.size()) >= accepted_, "TokenMatcher: ", generated.size(),
           " generated tokens, but ", accepted_, " were accepted already");
  for (size_t i = size_t(accepted_); i < generated.size(); ++i)
    if (!accept(generated[i]))
      throw InternalError(detail::str_cat("structured output: generated token ", generated[i],
                                          " (position ", i, ") is not allowed by the schema"));
}

}  // namespace tformers::generation
