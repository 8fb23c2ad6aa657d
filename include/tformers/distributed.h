// Tensor parallelism: one process per chip, as Transformers' DistributedConfig / tp_plan.
//
//   // started by: tformers launch --nproc-per-node 2 -- ./my_program
//   auto model = tformers::AutoModelForCausalLM::from_pretrained(
//       "Qwen/Qwen3-0.6B", {.distributed_config = tformers::DistributedConfig{}});
//   auto out = model.generate(ids, {.max_new_tokens = 20, .seed = 1234});
//   if (tformers::distributed::is_main_process()) print(out);
//
// Processes are MPI ranks (Open MPI). A program started without mpirun is a one-rank world and
// never initializes MPI. Each rank reads only its own slice of every sharded weight from the
// mmap'd checkpoint; collectives (all_reduce, all_gather) are graph ops.
//
// Agreement across ranks: every rank computes bitwise identical logits (all_reduce sums the
// ranks' contributions in rank order on every rank), so every rank makes the same greedy choice,
// and sampling agrees when every rank uses the same seed. Pass GenerationConfig::seed (or use
// distributed::agree_seed, which hands every rank rank 0's value).
//
// Failure: a rank that throws out of main (or calls distributed::fail) aborts the whole job
// (MPI_Abort), and a rank that dies is noticed by mpirun, which kills the others; no rank hangs
// in a collective waiting for a dead peer. A rank that stops answering without dying (stopped,
// hung, paused in a debugger) is caught by the collective timeout: a rank that waits longer than
// that for its peers prints which collective timed out and aborts the job.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace tformers {

struct DistributedConfig {
  // Processes the model is split over; unset means the world size (every rank of mpirun).
  // Must divide the world size; consecutive ranks form one tensor-parallel group.
  std::optional<int64_t> tp_size;
  // Rules {module pattern: style} that override the architecture's default plan entry with the
  // same key (or add a new one); every other default entry is kept. Patterns are module names
  // relative to the base model ("layers.*.self_attn.q_proj", "embed_tokens") or the causal LM
  // ("lm_head"); `*` matches one path component such as a layer index. Styles: colwise,
  // rowwise, colwise_gather_output (alias colwise_rep), rowwise_split_input (alias rowwise_rep),
  // embedding_rowwise, packed_colwise, replicated_with_grad_allreduce, replicate (alias local).
  // An unknown key or style is an InvalidArgumentError listing the valid ones.
  std::map<std::string, std::string> tp_plan;
  // Seconds a collective may wait for the other ranks before the job is aborted. Unset means
  // $TFORMERS_TP_TIMEOUT (also set by `tformers launch --tp-timeout S`), else 60. Ranks must
  // start generating within this of each other, so raise it when loading is slow or uneven.
  std::optional<double> timeout;
};

namespace distributed {

// The MPI world (initialized on first use when started by mpirun; otherwise one rank).
int world_rank();
int world_size();
// True on rank 0: the rank that prints.
bool is_main_process();
// Rank 0's value on every rank (a no-op in a one-rank world).
uint64_t agree_seed(uint64_t seed);
// Ends a failed rank: in a world of several ranks, prints nothing more and aborts every rank
// (MPI_Abort) so none waits for this one; in a one-rank world returns `code` for main to return.
int fail(int code);

}  // namespace distributed
}  // namespace tformers
