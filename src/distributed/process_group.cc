#include "distributed/process_group.h"

#if TFORMERS_WITH_MPI
#include <mpi.h>
#endif

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

#include "tformers/distributed.h"
#include "tformers/error.h"

namespace tformers::distributed {

namespace {

std::atomic<int> g_fatal_fd{2};
std::atomic<void (*)()> g_before_abort{nullptr};

std::mutex& registry_mutex() {
  static std::mutex mu;
  return mu;
}
std::vector<std::shared_ptr<ProcessGroup>>& registry() {
  static std::vector<std::shared_ptr<ProcessGroup>> groups;
  return groups;
}

class SingleProcessGroup : public ProcessGroup {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce_sum(const float* in, float* out, int64_t n) override {
    if (in != out) std::memcpy(out, in, size_t(n) * sizeof(float));
  }
  void all_gather(const float* in, float* out, int64_t n) override {
    if (in != out) std::memcpy(out, in, size_t(n) * sizeof(float));
  }
  void broadcast(void*, int64_t, int, Wait) override {}
  void barrier() override {}
  [[noreturn]] void abort(int code) override {
    std::fflush(nullptr);
    std::_Exit(code);
  }
};

#if TFORMERS_WITH_MPI
void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw Error(detail::str_cat("MPI ", what, " failed: ", std::string(msg, size_t(len))));
}

#endif

// Seconds; 0 until set or read from the environment.
std::atomic<double>& timeout_setting() {
  static std::atomic<double> seconds{0.0};
  return seconds;
}

double checked_timeout(double seconds, const char* source) {
  if (!std::isfinite(seconds) || seconds <= 0)
    throw InvalidArgumentError(
        detail::str_cat(source, " = ", seconds,
                        " is not a valid collective timeout: give a number of seconds > 0"));
  return seconds;
}

#if TFORMERS_WITH_MPI
// Waits for a nonblocking collective, or ends the job when the peers do not answer in time. A
// blocking MPI collective would wait forever for a rank that is stopped rather than dead.
void wait_or_abort(MPI_Request& req, const char* what, int rank, bool bounded = true) {
  using Clock = std::chrono::steady_clock;
  const double timeout = collective_timeout();
  const auto start = Clock::now();
  int done = 0;
  for (int polls = 0;; ++polls) {
    check_mpi(MPI_Test(&req, &done, MPI_STATUS_IGNORE), what);
    if (done) return;
    // Decode steps exchange small vectors many times a second: poll hot at first, then back off
    // so that waiting for a slow peer does not take a whole core.
    if (polls < 10000) continue;
    const double waited = std::chrono::duration<double>(Clock::now() - start).count();
    if (bounded && waited > timeout) {
      write_fatal_line(
          "tformers: rank %d: collective %s got no answer from the other ranks in %.3g s: a rank "
          "has stopped or hung. Ending the job. (The timeout is DistributedConfig::timeout, "
          "TFORMERS_TP_TIMEOUT or launch --tp-timeout.)\n",
          rank, what, timeout);
      MPI_Abort(MPI_COMM_WORLD, 1);
      std::_Exit(1);
    }
    // An idle wait past a second polls a thousand times a second, not ten thousand.
    std::this_thread::sleep_for(std::chrono::microseconds(waited > 1.0 ? 1000 : 100));
  }
}

class MpiProcessGroup : public ProcessGroup {
 public:
  explicit MpiProcessGroup(MPI_Comm comm) : comm_(comm) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(const float* in, float* out, int64_t n) override {
    // Gather every contribution, then sum them in rank order: the same operations in the same
    // order on every rank, hence bitwise identical results and identical greedy/sampled tokens.
    if (scratch_.size() < size_t(n) * size_t(size_)) scratch_.resize(size_t(n) * size_t(size_));
    MPI_Request req;
    check_mpi(
        MPI_Iallgather(in, int(n), MPI_FLOAT, scratch_.data(), int(n), MPI_FLOAT, comm_, &req),
        "all_gather (all_reduce)");
    wait_or_abort(req, "all_reduce", rank_);
    const float* s = scratch_.data();
    for (int64_t i = 0; i < n; ++i) out[i] = s[i];
    for (int r = 1; r < size_; ++r)
      for (int64_t i = 0; i < n; ++i) out[i] += s[int64_t(r) * n + i];
  }

  void all_gather(const float* in, float* out, int64_t n) override {
    TF_CHECK(n <= INT_MAX, "all_gather of ", n, " values per rank (MPI counts are int)");
    MPI_Request req;
    check_mpi(MPI_Iallgather(in, int(n), MPI_FLOAT, out, int(n), MPI_FLOAT, comm_, &req),
              "all_gather");
    wait_or_abort(req, "all_gather", rank_);
  }

  void broadcast(void* data, int64_t bytes, int root, Wait wait) override {
    TF_CHECK(bytes <= INT_MAX, "broadcast of ", bytes, " bytes (MPI counts are int)");
    MPI_Request req;
    check_mpi(MPI_Ibcast(data, int(bytes), MPI_BYTE, root, comm_, &req), "broadcast");
    wait_or_abort(req, "broadcast", rank_, wait == Wait::kBounded);
  }
  void barrier() override {
    MPI_Request req;
    check_mpi(MPI_Ibarrier(comm_, &req), "barrier");
    wait_or_abort(req, "barrier", rank_);
  }
  [[noreturn]] void abort(int code) override {
    std::fflush(nullptr);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);  // MPI_Abort does not return; this keeps [[noreturn]] honest
  }

 private:
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  std::vector<float> scratch_;
};

void finalize_at_exit() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Finalize();
}

// Uncaught exceptions on one rank must not leave the others blocked in a collective.
[[noreturn]] void terminate_handler() {
  if (auto e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      write_fatal_line("tformers: rank %d: uncaught exception: %s\n", world_rank(), x.what());
    } catch (...) {
      write_fatal_line("tformers: rank %d: uncaught exception\n", world_rank());
    }
  }
  std::fflush(nullptr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

#endif

}  // namespace

void ProcessGroup::all_gather_last_dim(const float* in, float* out, int64_t rows, int64_t width,
                                       std::vector<float>& scratch) {
  if (rows == 1) {  // rank-major order is already the concatenation
    all_gather(in, out, width);
    return;
  }
  const int64_t ranks = size();
  scratch.resize(size_t(ranks * rows * width));
  all_gather(in, scratch.data(), rows * width);
  // (rank, row, piece) -> (row, rank's columns)
  for (int64_t r = 0; r < ranks; ++r)
    for (int64_t i = 0; i < rows; ++i)
      std::memcpy(out + (i * ranks + r) * width, scratch.data() + (r * rows + i) * width,
                  size_t(width) * sizeof(float));
}

void set_fatal_output(int fd, void (*before_abort)()) {
  g_fatal_fd = fd;
  g_before_abort = before_abort;
}

void write_fatal_line(const char* format, ...) {
  std::fflush(nullptr);
  if (void (*hook)() = g_before_abort.load()) hook();
  char line[1024];
  va_list args;
  va_start(args, format);
  const int n = std::vsnprintf(line, sizeof line, format, args);
  va_end(args);
  const size_t len = n < 0 ? 0 : std::min(size_t(n), sizeof line - 1);
  for (size_t done = 0; done < len;) {
    const ssize_t k = ::write(g_fatal_fd.load(), line + done, len - done);
    if (k <= 0) break;
    done += size_t(k);
  }
}

const char* missing_mpi() {
#if TFORMERS_WITH_MPI
  return nullptr;
#else
  return "this build of tformers has no MPI, which tensor parallelism needs to run one process "
         "per shard: install Open MPI (Debian: libopenmpi-dev openmpi-bin) and rebuild with "
         "-DTFORMERS_WITH_MPI=ON";
#endif
}

int register_group(std::shared_ptr<ProcessGroup> group) {
  std::lock_guard lock(registry_mutex());
  group->id_ = int(registry().size());
  registry().push_back(std::move(group));
  return registry().back()->id_;
}

ProcessGroup& group(int id) {
  std::lock_guard lock(registry_mutex());
  TF_CHECK(id >= 0 && id < int(registry().size()), "no process group ", id);
  return *registry()[size_t(id)];
}

double collective_timeout() {
  double t = timeout_setting().load();
  if (t > 0) return t;
  const char* env = std::getenv("TFORMERS_TP_TIMEOUT");
  if (!env || !*env) return kDefaultCollectiveTimeout;
  char* end = nullptr;
  double v = std::strtod(env, &end);
  if (end == env || *end != '\0')
    throw InvalidArgumentError(
        detail::str_cat("TFORMERS_TP_TIMEOUT = '", env, "' is not a number of seconds"));
  timeout_setting().store(checked_timeout(v, "TFORMERS_TP_TIMEOUT"));
  return v;
}

void set_collective_timeout(double seconds) {
  timeout_setting().store(checked_timeout(seconds, "DistributedConfig::timeout"));
}

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"})
    if (std::getenv(v)) return true;
  return false;
}

std::shared_ptr<ProcessGroup> world() {
  static std::shared_ptr<ProcessGroup> w = [] {
    std::shared_ptr<ProcessGroup> g;
    if (launched_by_mpi()) {
#if !TFORMERS_WITH_MPI
      throw UnsupportedError(detail::str_cat("started by mpirun, but ", missing_mpi()));
#else
      int init = 0;
      MPI_Initialized(&init);
      if (!init) {
        // A rank leaving with an error must not wait in MPI_Finalize for peers that are blocked
        // in a collective waiting for it: finalize without the job-wide fence, so the rank exits
        // and mpirun, seeing a non-zero exit, ends the job.
        setenv("OMPI_MCA_async_mpi_finalize", "1", 0);
        int provided = 0;
        // Serialized, not funneled: a server's steps (and their collectives) run on its
        // scheduler thread, not the thread that initialized MPI; one thread at a time.
        check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "init");
        if (provided < MPI_THREAD_SERIALIZED)
          throw UnsupportedError(
              "this MPI library offers only MPI_THREAD_FUNNELED or less, but tformers calls "
              "collectives from a server's scheduler thread (MPI_THREAD_SERIALIZED): use an Open "
              "MPI built with thread support, as Debian's libopenmpi-dev is");
        std::atexit(finalize_at_exit);
      }
      g = std::make_shared<MpiProcessGroup>(MPI_COMM_WORLD);
      if (g->size() > 1) std::set_terminate(terminate_handler);
#endif
    } else {
      g = std::make_shared<SingleProcessGroup>();
    }
    register_group(g);
    return g;
  }();
  return w;
}

std::shared_ptr<ProcessGroup> tp_group(int64_t tp_size) {
  if (tp_size > 1 && missing_mpi())
    throw UnsupportedError(detail::str_cat("tp_size ", tp_size, ": ", missing_mpi()));
  std::shared_ptr<ProcessGroup> w = world();
  const int ws = w->size();
  if (tp_size < 1 || tp_size > ws || ws % tp_size)
    throw InvalidArgumentError(detail::str_cat(
        "DistributedConfig.tp_size ", tp_size, " does not fit a world of ", ws,
        " process(es): it must divide the world size. Start one process per shard with "
        "`tformers launch --nproc-per-node ",
        tp_size, " -- <command>` (or mpirun -np ", tp_size, ")"));
  if (tp_size == ws) return w;
  static std::mutex mu;
  static std::map<int64_t, std::shared_ptr<ProcessGroup>> groups;
  std::lock_guard lock(mu);
  if (auto it = groups.find(tp_size); it != groups.end()) return it->second;
  std::shared_ptr<ProcessGroup> g;
  if (tp_size == 1) {
    g = std::make_shared<SingleProcessGroup>();
  } else {
#if TFORMERS_WITH_MPI
    MPI_Comm comm;
    check_mpi(MPI_Comm_split(MPI_COMM_WORLD, int(w->rank() / tp_size), w->rank(), &comm), "split");
    g = std::make_shared<MpiProcessGroup>(comm);
#endif
  }
  register_group(g);
  return groups[tp_size] = g;
}

int world_rank() { return world()->rank(); }
int world_size() { return world()->size(); }
bool is_main_process() { return world_rank() == 0; }

uint64_t agree_seed(uint64_t seed) {
  world()->broadcast(&seed, sizeof seed, 0);
  return seed;
}

int fail(int code) {
  if (launched_by_mpi() && world_size() > 1) world()->abort(code);
  return code;
}

}  // namespace tformers::distributed
