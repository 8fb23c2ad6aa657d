// A fixed pool of worker threads for data-parallel kernels. parallel_for splits [0, n) into a few
// contiguous tasks per thread, which the caller and the workers claim from a shared counter, and
// blocks until all are done. Claiming (rather than one fixed chunk per thread) lets the threads
// that are running take over the share of one the scheduler has parked: with another process
// busy on one of two cores, fixed chunks made 2 threads decode at 0.7x of 1 thread. Workers spin
// briefly before they sleep, because decode issues hundreds of small parallel regions per token
// and a condition variable round trip per region would cost more than the work.
//
// Several threads may call parallel_for at once (two models decoding on two threads): their
// regions take turns on the pool, each with all its threads, since the workers serve one call at
// a time and two callers would otherwise both run as thread index 0 (see parallel_for).
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

  // fn(begin, end, thread_index) over chunks of [0, n) that cover it exactly once; chunk
  // boundaries are multiples of `grain` so kernels can keep blocks whole. A thread may get
  // several chunks; calls with the same thread_index never overlap in time.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn,
                    int64_t grain = 1);

  // The process-wide pool used by the CPU backend; its size comes from TFORMERS_NUM_THREADS or
  // the hardware. Safe to call from any thread.
  static ThreadPool& global();
  // Replaces the global pool's size (for benchmarks and the --threads flag); not while another
  // thread uses the pool.
  static void set_global_threads(int num_threads);

 private:
  // One parallel_for call, on its caller's stack. Tasks are claimed through `next` and counted
  // through `done`.
  struct Job {
    const std::function<void(int64_t, int64_t, int)>* fn;
    int64_t n, grain, chunks, tasks;
    std::atomic<int64_t> next{0}, done{0};
  };
  void worker_loop(int index);
  static void work(Job& job, int index);

  std::vector<std::thread> workers_;
  // Held by the caller whose call owns the workers (job_ and active_ below serve one call): one
  // uncontended lock per region for a single caller.
  std::mutex call_mu_;
  // The call in progress, or null. A worker announces itself in active_ before it reads job_,
  // and the caller clears job_ and waits for active_ to drain before its Job goes away, so a
  // worker that wakes late never touches a finished call (both pairs are sequentially
  // consistent: store then load on each side).
  std::atomic<Job*> job_{nullptr};
  std::atomic<int> active_{0};
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace tformers
