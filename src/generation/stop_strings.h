// Transformers' StopStringCriteria for one row: the generated text is decoded incrementally and
// the row stops once it contains a stop string that ends within the token just added.
#pragma once

#include <string>
#include <vector>

#include "tformers/tokenizer.h"

namespace tformers::generation {

class StopStrings {
 public:
  StopStrings(const Tokenizer& tokenizer, const std::vector<std::string>& stops)
      : streamer_(tokenizer), stops_(&stops) {}
  // Adds a generated token; true when a stop string now ends inside the text it completed.
  bool put(int32_t id) {
    const size_t before = text_.size();
    text_ += streamer_.put(id);
    if (text_.size() == before) return false;
    for (const std::string& s : *stops_) {
      const size_t from = before >= s.size() ? before - s.size() + 1 : 0;
      if (text_.find(s, from) != std::string::npos) return true;
    }
    return false;
  }

 private:
  TokenStreamer streamer_;
  const std::vector<std::string>* stops_;
  std::string text_;
};

}  // namespace tformers::generation
