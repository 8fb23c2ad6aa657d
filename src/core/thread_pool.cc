#include "core/thread_pool.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "core/thread_limit.h"
#include "tformers/error.h"

namespace tformers {

namespace {
// TFORMERS_NUM_THREADS when set and not empty; a value that is no count in range is refused
// rather than ignored (1025 started 1,025 threads; -1 and "abc" fell back to every core).
int default_threads() {
  if (const char* s = std::getenv("TFORMERS_NUM_THREADS"); s && *s) {
    int n = 0;
    const char* end = s + std::strlen(s);
    const auto [ptr, ec] = std::from_chars(s, end, n);
    if (ec != std::errc() || ptr != end || n < 1 || n > kMaxThreads)
      throw InvalidArgumentError(detail::str_cat("TFORMERS_NUM_THREADS=", s,
                                                 ": give a thread count from 1 to ", kMaxThreads,
                                                 ", or unset it to use every core"));
    return n;
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

void ThreadPool::work(Job& job, int index) {
  for (;;) {
    const int64_t t = job.next.fetch_add(1, std::memory_order_relaxed);
    if (t >= job.tasks) return;
    const int64_t b = job.chunks * t / job.tasks * job.grain;
    const int64_t e = std::min(job.n, job.chunks * (t + 1) / job.tasks * job.grain);
    if (b < e) (*job.fn)(b, e, index);
    job.done.fetch_add(1, std::memory_order_release);
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn,
                              int64_t grain) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  if (workers_.empty() || n <= grain) {
    fn(0, n, 0);
    return;
  }
  // Two tasks per thread: a parked thread's share can move, while each thread still streams
  // long contiguous ranges (decode GEMVs read weights at the speed of a sequential stream).
  const int64_t chunks = (n + grain - 1) / grain;
  std::lock_guard<std::mutex> call(call_mu_);
  Job job{&fn, n, grain, chunks, std::min<int64_t>(chunks, 2 * num_threads())};
  job_.store(&job);
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
  work(job, 0);
  while (job.done.load(std::memory_order_acquire) != job.tasks) {
  }
  job_.store(nullptr);
  while (active_.load() != 0) {
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
    active_.fetch_add(1);
    if (Job* job = job_.load()) work(*job, index);
    active_.fetch_sub(1);
  }
}

ThreadPool& ThreadPool::global() {
  // Created once even when the first calls come from several threads at once (unless
  // set_global_threads made it first).
  static std::once_flag once;
  std::call_once(once, [] {
    if (!global_slot()) global_slot() = std::make_unique<ThreadPool>();
  });
  return *global_slot();
}

void ThreadPool::set_global_threads(int num_threads) {
  global_slot() = std::make_unique<ThreadPool>(num_threads);
}

}  // namespace tformers
