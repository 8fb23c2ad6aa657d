// `tformers launch`: torchrun's interface over mpirun. Starts one process per chip,
//
//   tformers launch --nproc-per-node N [--nnodes M --node-rank R --master-addr A --master-port P
//                                       | --hostfile F] -- CMD...
//
// through mpirun (with --allow-run-as-root when run as root, --oversubscribe when N exceeds the
// cores), and each process runs CMD with RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT set, its chip made device 0 (CUDA_VISIBLE_DEVICES, TPU_VISIBLE_CHIPS)
// and, unless set, TFORMERS_NUM_THREADS = its share of the node's cores.
#pragma once

namespace tformers::distributed {

extern const char* const kLaunchHelp;

// True for the argv[1] values that launcher_main handles ("launch" and the per-rank step).
bool is_launcher_command(const char* arg);
// Runs `tformers <argv[0]> ...` where argv[0] is "launch" (execs mpirun) or the per-rank step
// (sets the rank's environment and execs CMD). Returns an exit code only on failure.
int launcher_main(int argc, char** argv);

// Asks the kernel to send this process SIGTERM when its parent dies (PR_SET_PDEATHSIG, kept
// across exec), and raises it at once when the parent is already gone. Each rank calls it
// before running the user's command, so a killed mpirun does not leave its ranks running.
void end_with_parent();

}  // namespace tformers::distributed
