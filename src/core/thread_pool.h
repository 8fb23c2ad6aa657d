// A fixed pool of worker threads for data-parallel kernels. parallel_for splits [0, n) into one
// contiguous chunk per thread and blocks until all are done. Workers spin briefly before they
// sleep, because decode issues hundreds of small parallel regions per token and a condition
// variable round trip per region would cost more than the work.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tformers {

class ThreadPool {
 public:
  // num_threads counts the calling thread; 0 means the number of hardware threads.
  explicit ThreadPool(int num_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return int(workers_.size()) + 1; }

  // fn(begin, end, thread_index) over chunks of [0, n); chunk boundaries are multiples of
  // `grain` so kernels can keep blocks whole.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn,
                    int64_t grain = 1);

  // The process-wide pool used by the CPU backend; its size comes from TFORMERS_NUM_THREADS or
  // the hardware.
  static ThreadPool& global();
  // Replaces the global pool's size (for benchmarks and the --threads flag).
  static void set_global_threads(int num_threads);

 private:
  void worker_loop(int index);
  void run_chunk(int index);

  std::vector<std::thread> workers_;
  const std::function<void(int64_t, int64_t, int)>* fn_ = nullptr;
  int64_t n_ = 0, grain_ = 1;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace tformers
