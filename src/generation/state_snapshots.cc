#include "generation/state_snapshots.h"

#include "tformers/error.h"

namespace tformers::generation {

StateSnapshots::StateSnapshots(int32_t first, int32_t count)
    : first_(first), slots_(size_t(count)) {}

int32_t StateSnapshots::find(uint64_t key) {
  const auto it = by_key_.find(key);
  if (it == by_key_.end()) return -1;
  at(it->second).used = ++clock_;
  return it->second;
}

void StateSnapshots::forget(int32_t slot) {
  Slot& s = at(slot);
  if (s.key != 0) by_key_.erase(s.key);
  s.key = 0;
}

int32_t StateSnapshots::take() {
  int32_t best = -1;
  for (int32_t i = 0; i < int32_t(slots_.size()); ++i) {
    const Slot& s = slots_[size_t(i)];
    if (s.pins > 0) continue;
    if (s.key == 0) {
      best = i;
      break;
    }
    if (best < 0 || s.used < slots_[size_t(best)].used) best = i;
  }
  if (best < 0) return -1;
  const int32_t slot = first_ + best;
  forget(slot);
  pin(slot);
  return slot;
}

void StateSnapshots::keep(uint64_t key, int32_t slot) {
  TF_CHECK(key != 0, "a snapshot needs a prefix key");
  if (const auto it = by_key_.find(key); it != by_key_.end() && it->second != slot)
    forget(it->second);
  forget(slot);
  Slot& s = at(slot);
  s.key = key;
  s.used = ++clock_;
  by_key_[key] = slot;
}

}  // namespace tformers::generation
