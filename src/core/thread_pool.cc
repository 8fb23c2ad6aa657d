#include "core/thread_pool.h"

#include <cstdlib>
#include <memory>

namespace tformers {

namespace {
int default_threads() {
  if (const char* s = std::getenv("TFORMERS_NUM_THREADS")) {
    int n = std::atoi(s);
    if (n > 0) return n;
  }
  unsigned hw = std::thread::hardware_concurrency();
  return hw ? int(hw) : 1;
}
std::unique_ptr<ThreadPool>& global_slot() {
  static std::unique_ptr<ThreadPool> pool;
  return pool;
}
}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = default_threads();
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    generation_.fetch_add(1);
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_chunk(int index) {
  int64_t chunks = (n_ + grain_ - 1) / grain_;
  int nt = num_threads();
  int64_t b = chunks * index / nt * grain_, e = chunks * (index + 1) / nt * grain_;
  if (e > n_) e = n_;
  if (b < e) (*fn_)(b, e, index);
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn,
                              int64_t grain) {
  if (n <= 0) return;
  if (workers_.empty() || n <= grain) {
    fn(0, n, 0);
    return;
  }
  fn_ = &fn;
  n_ = n;
  grain_ = grain < 1 ? 1 : grain;
  pending_.store(int(workers_.size()), std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
  run_chunk(0);
  while (pending_.load(std::memory_order_acquire) != 0) {
  }
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    // Spin for a short while (new work usually follows within microseconds during a forward
    // pass), then fall back to sleeping on the condition variable.
    uint64_t g = generation_.load(std::memory_order_acquire);
    for (int spin = 0; g == seen && spin < 200000; ++spin) {
      g = generation_.load(std::memory_order_acquire);
    }
    if (g == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      g = generation_.load(std::memory_order_acquire);
    }
    seen = g;
    if (stop_) return;
    run_chunk(index);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

ThreadPool& ThreadPool::global() {
  auto& slot = global_slot();
  if (!slot) slot = std::make_unique<ThreadPool>();
  return *slot;
}

void ThreadPool::set_global_threads(int num_threads) {
  global_slot() = std::make_unique<ThreadPool>(num_threads);
}

}  // namespace tformers
