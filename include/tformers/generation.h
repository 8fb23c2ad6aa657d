// Generation settings, named as in Transformers' GenerationConfig.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace tformers {

struct GenerationConfig {
  std::optional<int64_t> max_new_tokens;  // default 20 (through max_length) as in Transformers
  std::optional<int64_t> max_length;
  std::vector<int64_t> eos_token_id;     // stop when one of these is generated
  std::optional<int64_t> max_cache_len;  // static cache size; default prompt + new tokens
};

}  // namespace tformers
