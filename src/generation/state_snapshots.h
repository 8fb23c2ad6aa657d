// Prefix caching for models with linear attention (serving). A cached block holds its positions'
// keys and values, but a linear-attention layer's recurrent state sums every position before it,
// so a prefix hit can only end where that state was kept. The engine keeps it at the end of each
// prompt's last whole block (the last block end a later prompt's hit can reach, since a prompt's
// last token is always computed): that prefill chunk writes its state to a slot of its own,
// found later by the block's prefix key (BlockManager's). Slots are reused least recently used
// first, never while a sequence is about to read one (pinned).
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace tformers::generation {

class StateSnapshots {
 public:
  // Slots [first, first + count) of the recurrent state pools.
  StateSnapshots(int32_t first, int32_t count);
  // The slot that holds the state after the prefix ending in the block of `key`, or -1.
  int32_t find(uint64_t key);
  // A slot to write a new state to, pinned: an empty one, else the least recently used one not
  // pinned (what it held forgotten); -1 when every slot is pinned.
  int32_t take();
  // Files the state in `slot` under `key` (a state already filed under it is forgotten).
  void keep(uint64_t key, int32_t slot);
  void pin(int32_t slot) { ++at(slot).pins; }
  void unpin(int32_t slot) { --at(slot).pins; }

 private:
  struct Slot {
    uint64_t key = 0;  // 0: holds nothing
    int pins = 0;
    uint64_t used = 0;  // when last found or kept
  };
  Slot& at(int32_t slot) { return slots_[size_t(slot - first_)]; }
  void forget(int32_t slot);

  int32_t first_;
  std::vector<Slot> slots_;
  std::unordered_map<uint64_t, int32_t> by_key_;
  uint64_t clock_ = 0;
};

}  // namespace tformers::generation
