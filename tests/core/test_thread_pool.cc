// The thread pool: every index covered exactly once, chunk boundaries on the grain, thread
// indices in range and never used by two chunks at once, with more threads than cores (this
// machine has 2) and back-to-back calls, so that a worker waking late meets a later call.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "tformers/error.h"

namespace tformers {
namespace {

TEST(ThreadPool, CoversEveryIndexOnceOnTheGrain) {
  for (int threads : {1, 2, 5}) {
    ThreadPool pool(threads);
    for (int64_t n : {1, 2, 7, 31, 32, 33, 1000, 4097})
      for (int64_t grain : {1, 4, 32}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        std::vector<std::atomic<int>> busy(static_cast<size_t>(threads));
        std::atomic<bool> bad_chunk{false}, overlap{false};
        pool.parallel_for(
            n,
            [&](int64_t b, int64_t e, int t) {
              if (t < 0 || t >= threads || b >= e || b % grain != 0 || (e % grain != 0 && e != n))
                bad_chunk = true;
              if (busy[size_t(t)].fetch_add(1) != 0) overlap = true;
              for (int64_t i = b; i < e; ++i) hits[size_t(i)].fetch_add(1);
              busy[size_t(t)].fetch_sub(1);
            },
            grain);
        EXPECT_FALSE(bad_chunk) << "threads " << threads << " n " << n << " grain " << grain;
        EXPECT_FALSE(overlap) << "threads " << threads << " n " << n;
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(hits[size_t(i)].load(), 1) << "threads " << threads << " n " << n << " i " << i;
      }
  }
}

// Many short calls in a row: each must see only its own work, finished, when it returns.
TEST(ThreadPool, BackToBackCallsStaySeparate) {
  ThreadPool pool(4);
  std::vector<int64_t> out(64);
  for (int call = 0; call < 20000; ++call) {
    pool.parallel_for(int64_t(out.size()), [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) out[size_t(i)] = call;
    });
    for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], call) << "call " << call;
  }
}

// TFORMERS_NUM_THREADS=1025 started 1,025 threads; -1 and "abc" were ignored for every core.
TEST(ThreadPool, TheEnvironmentVariableIsRangeChecked) {
  for (const char* bad : {"1025", "-1", "0", "abc", "4x"}) {
    ::setenv("TFORMERS_NUM_THREADS", bad, 1);
    try {
      ThreadPool pool;
      ADD_FAILURE() << "TFORMERS_NUM_THREADS=" << bad << " gave " << pool.num_threads()
                    << " threads";
    } catch (const InvalidArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("TFORMERS_NUM_THREADS=") + bad +
                                           ": give a thread count from 1 to 1024"),
                std::string::npos)
          << e.what();
    }
  }
  ::setenv("TFORMERS_NUM_THREADS", "3", 1);
  EXPECT_EQ(ThreadPool().num_threads(), 3);
  ::unsetenv("TFORMERS_NUM_THREADS");
}

}  // namespace
}  // namespace tformers
