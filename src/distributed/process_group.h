// Process groups: the ranks a tensor-parallel model is split over and the collectives between
// them. The MPI implementation serves processes started by mpirun (one machine or several);
// the single-process one serves everything else. Executables find their group by the id that
// collective graph nodes carry (their attributes' group), so a compiled graph never holds a
// pointer and two groups never share an executable.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace tformers::distributed {

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // out[i] = sum over ranks of in[i], summed in rank order on every rank, so all ranks hold
  // bitwise the same result (MPI_Allreduce does not promise that). in may equal out.
  virtual void all_reduce_sum(const float* in, float* out, int64_t n) = 0;
  // Every rank's n values into out (size() * n), in rank order.
  virtual void all_gather(const float* in, float* out, int64_t n) = 0;
  // The all-gather of a tensor split evenly along its last dim: in is this rank's (rows, width)
  // piece, out the whole (rows, size() * width), each row the ranks' pieces in rank order. When
  // rows > 1 the pieces arrive rank-major in `scratch` (grown as needed) and are interleaved.
  void all_gather_last_dim(const float* in, float* out, int64_t rows, int64_t width,
                           std::vector<float>& scratch);
  // How long a collective may wait for its peers: the collective timeout, or without end for a
  // rank that waits for its next step from a server that may have no request for hours (the
  // wait then sleeps between polls).
  enum class Wait { kBounded, kUnbounded };
  virtual void broadcast(void* data, int64_t bytes, int root, Wait wait = Wait::kBounded) = 0;
  virtual void barrier() = 0;
  // Ends every rank of the job with `code`; never returns.
  [[noreturn]] virtual void abort(int code) = 0;
  // The id collective nodes carry (see register_group).
  int id() const { return id_; }

 private:
  friend int register_group(std::shared_ptr<ProcessGroup> group);
  int id_ = -1;
};

// Makes a group reachable by id from executables; returns the id.
int register_group(std::shared_ptr<ProcessGroup> group);
ProcessGroup& group(int id);
// Where this rank's piece of `piece` values starts when each rank of group `id` holds one, in
// rank order: rank * piece; 0 for no group (id < 0). Graph nodes that name a group (a vocabulary
// shard, a split input) read their offset from here when they run or lower.
inline int64_t rank_offset(int id, int64_t piece) {
  return id < 0 ? 0 : int64_t(group(id).rank()) * piece;
}

// The world: every rank of mpirun when started by it (MPI initialized here, finalized at exit),
// else a one-rank group that never touches MPI.
std::shared_ptr<ProcessGroup> world();
// Groups of tp_size consecutive world ranks; this rank's group. InvalidArgumentError when
// tp_size does not divide the world size or exceeds it.
std::shared_ptr<ProcessGroup> tp_group(int64_t tp_size);
// Null when this build has MPI; else the message that tensor parallelism cannot run and how to
// rebuild (TFORMERS_WITH_MPI is a build option, ON when Open MPI is found).
const char* missing_mpi();
// True when this process was started by mpirun (Open MPI or a PMI launcher).
bool launched_by_mpi();

// Seconds a collective of any MPI group waits for its peers before it prints which collective
// timed out and aborts the job: set_collective_timeout's value, else $TFORMERS_TP_TIMEOUT, else
// kDefaultCollectiveTimeout. InvalidArgumentError for a value that is not a finite number > 0
// (naming the variable when it came from the environment).
inline constexpr double kDefaultCollectiveTimeout = 60.0;
double collective_timeout();
// DistributedConfig::timeout, applied to every group of the process.
void set_collective_timeout(double seconds);

// Where this layer writes the line that says why it ends the job (a collective that got no
// answer, an uncaught exception) before MPI_Abort: descriptor `fd` (default 2), after calling
// `before_abort` (may be null). A program that silences a rank's stderr, or holds it back while
// text streams, points `fd` at the real stderr and passes what releases the held lines, so that
// the reason reaches the user rather than a file that MPI_Abort leaves unread.
void set_fatal_output(int fd, void (*before_abort)());

// Writes one such line (formatted as printf) as set_fatal_output says; for the abort paths.
void write_fatal_line(const char* format, ...) __attribute__((format(printf, 1, 2)));

}  // namespace tformers::distributed
