#include "distributed/launcher.h"

#include "core/thread_limit.h"
#include "distributed/process_group.h"

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

namespace tformers::distributed {

const char* const kLaunchHelp =
    "Start one process per chip through mpirun: launch --nproc-per-node N [--nnodes M "
    "--node-rank R --master-addr A --master-port P | --hostfile F] [--tp-timeout S] -- CMD... "
    "(--tp-timeout: seconds a rank waits for the others in a collective before the job is "
    "aborted; default 60)";

namespace {

constexpr const char* kRankStep = "__launch-rank";

int usage(const std::string& why) {
  std::fprintf(stderr,
               "error: tformers launch: %s\nusage: tformers launch --nproc-per-node N "
               "[--nnodes M --node-rank R --master-addr A --master-port P | --hostfile F] "
               "[--tp-timeout S] -- CMD...\n",
               why.c_str());
  return 2;
}

bool parse_int(const char* s, long& out) {
  char* end = nullptr;
  errno = 0;
  out = std::strtol(s, &end, 10);
  return s[0] && end && *end == '\0' && errno == 0;
}

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

// The `index`-th entry of a comma-separated list, or "" when absent.
std::string list_entry(const std::string& list, long index) {
  size_t b = 0;
  for (long i = 0; i < index; ++i) {
    b = list.find(',', b);
    if (b == std::string::npos) return "";
    ++b;
  }
  return list.substr(b, list.find(',', b) - b);
}

[[noreturn]] void exec_or_die(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  std::fprintf(stderr, "error: tformers launch: cannot run '%s': %s\n", argv[0],
               std::strerror(errno));
  std::_Exit(127);
}

volatile sig_atomic_t g_mpirun = 0;
volatile sig_atomic_t g_stops = 0;

// SIGTERM, SIGINT or SIGHUP to the launcher. mpirun itself ends a job on SIGTERM by killing
// every rank a second later, which leaves a server no time to finish its streams. So the first
// becomes SIGUSR1, which mpirun hands to every rank of the job and otherwise ignores (serve
// stops on it as on SIGTERM; a program without a handler ends at once); the second is passed on
// as SIGTERM, mpirun's own way of ending the job.
void on_stop(int) {
  if (g_mpirun <= 0) return;
  ::kill(pid_t(g_mpirun), g_stops == 0 ? SIGUSR1 : SIGTERM);
  g_stops = 1;
}

// Runs mpirun as a child (ended with the launcher) and returns its exit status.
int run_mpirun(const std::vector<std::string>& cmd) {
  std::fflush(nullptr);
  const pid_t child = fork();
  if (child < 0) {
    std::fprintf(stderr, "error: tformers launch: cannot start mpirun: %s\n", std::strerror(errno));
    return 1;
  }
  if (child == 0) {
    end_with_parent();
    exec_or_die(cmd);
  }
  g_mpirun = child;
  struct sigaction sa = {};
  sa.sa_handler = on_stop;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) sigaction(sig, &sa, nullptr);
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

void end_with_parent() {
  // The parent is the process that started this rank (mpirun, or its daemon on another node).
  // When it is killed, its ranks would run on as orphans, holding memory and chips, with no
  // one to collect their output: SIGTERM ends them instead (serve drains, generate exits). The
  // setting survives exec, so it covers the user's command.
  const pid_t parent = getppid();
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  // The parent may have died before the call: then this process was already reparented.
  if (getppid() != parent) raise(SIGTERM);
}

namespace {

// Inside mpirun: this rank's environment, then the user's command in place of this process.
int rank_step(int argc, char** argv) {
  int sep = 1;
  while (sep < argc && std::strcmp(argv[sep], "--") != 0) ++sep;
  if (sep + 1 >= argc) return usage("no command after --");
  const std::string rank = env_or("OMPI_COMM_WORLD_RANK", env_or("PMIX_RANK", "0"));
  const std::string local = env_or("OMPI_COMM_WORLD_LOCAL_RANK", "0");
  const std::string size = env_or("OMPI_COMM_WORLD_SIZE", "1");
  const std::string local_size = env_or("OMPI_COMM_WORLD_LOCAL_SIZE", "1");
  setenv("RANK", rank.c_str(), 1);
  setenv("LOCAL_RANK", local.c_str(), 1);
  setenv("WORLD_SIZE", size.c_str(), 1);
  setenv("LOCAL_WORLD_SIZE", local_size.c_str(), 1);
  // Every rank sees its own chip as device 0; a list the user already narrowed is indexed.
  long lr = std::atol(local.c_str());
  for (const char* var : {"CUDA_VISIBLE_DEVICES", "TPU_VISIBLE_CHIPS"}) {
    const char* cur = std::getenv(var);
    std::string dev = cur && *cur ? list_entry(cur, lr) : local;
    if (!dev.empty()) setenv(var, dev.c_str(), 1);
  }
  // One chip per process on TPU hosts (libtpu reads these with TPU_VISIBLE_CHIPS).
  setenv("TPU_CHIPS_PER_PROCESS_BOUNDS", "1,1,1", 0);
  setenv("TPU_PROCESS_BOUNDS", "1,1,1", 0);
  // CPU ranks share the node's cores instead of each spinning a thread per core.
  long nlocal = std::max(1L, std::atol(local_size.c_str()));
  long cores = long(std::thread::hardware_concurrency());
  // At most kMaxThreads, which TFORMERS_NUM_THREADS may not exceed.
  std::string threads = std::to_string(std::clamp(cores / nlocal, 1L, long(kMaxThreads)));
  setenv("TFORMERS_NUM_THREADS", threads.c_str(), 0);
  end_with_parent();
  exec_or_die(std::vector<std::string>(argv + sep + 1, argv + argc));
}

}  // namespace

bool is_launcher_command(const char* arg) {
  return arg && (std::strcmp(arg, "launch") == 0 || std::strcmp(arg, kRankStep) == 0);
}

int launcher_main(int argc, char** argv) {
  if (const char* why = missing_mpi()) {
    std::fprintf(stderr, "error: tformers launch: %s\n", why);
    return 2;
  }
  if (std::strcmp(argv[0], kRankStep) == 0) return rank_step(argc, argv);
  constexpr long kMaxLaunchCount = 4096;
  long nproc = 0, nnodes = 1, node_rank = 0, port = 29500;
  std::string master = "127.0.0.1", hostfile, tp_timeout;
  int i = 1;
  for (; i < argc && std::strcmp(argv[i], "--") != 0; ++i) {
    std::string k = argv[i];
    if (k == "-h" || k == "--help") {
      std::printf("%s\n", kLaunchHelp);
      return 0;
    }
    if (i + 1 >= argc) return usage(k + " needs a value");
    const char* v = argv[++i];
    if (k == "--nproc-per-node" || k == "--nproc_per_node") {
      // Bounded so that the world size (nproc * nnodes) cannot overflow.
      if (!parse_int(v, nproc) || nproc < 1 || nproc > kMaxLaunchCount)
        return usage("--nproc-per-node must be in [1, 4096]");
    } else if (k == "--nnodes") {
      if (!parse_int(v, nnodes) || nnodes < 1 || nnodes > kMaxLaunchCount)
        return usage("--nnodes must be in [1, 4096]");
    } else if (k == "--node-rank" || k == "--node_rank") {
      if (!parse_int(v, node_rank) || node_rank < 0) return usage("--node-rank must be >= 0");
    } else if (k == "--master-addr" || k == "--master_addr") {
      master = v;
    } else if (k == "--master-port" || k == "--master_port") {
      if (!parse_int(v, port) || port < 1 || port > 65535) return usage("bad --master-port");
    } else if (k == "--tp-timeout" || k == "--tp_timeout") {
      char* end = nullptr;
      double t = std::strtod(v, &end);
      if (end == v || *end != '\0' || !std::isfinite(t) || t <= 0)
        return usage("--tp-timeout must be a number of seconds > 0");
      tp_timeout = v;
    } else if (k == "--hostfile") {
      hostfile = v;
      if (!std::filesystem::exists(hostfile)) return usage("hostfile '" + hostfile + "' not found");
    } else {
      return usage("unknown option '" + k + "'");
    }
  }
  if (nproc < 1) return usage("--nproc-per-node is required");
  if (i + 1 >= argc) return usage("no command: put it after --");
  if (node_rank >= nnodes) return usage("--node-rank must be below --nnodes");
  if (nnodes > 1 && hostfile.empty())
    return usage(
        "--nnodes > 1 needs --hostfile listing the nodes: mpirun on the first node starts "
        "every node's processes over ssh, so run launch once, there");
  if (node_rank > 0) {
    std::fprintf(stderr,
                 "tformers launch: node %ld: mpirun on node 0 (%s) starts this node's processes; "
                 "nothing to do here\n",
                 node_rank, master.c_str());
    return 0;
  }
  const long world = nproc * nnodes;
  std::vector<std::string> cmd = {"mpirun", "-np", std::to_string(world)};
  if (geteuid() == 0) cmd.push_back("--allow-run-as-root");
  if (!hostfile.empty()) {
    cmd.insert(cmd.end(), {"--hostfile", hostfile, "--npernode", std::to_string(nproc)});
  } else if (nproc > long(std::thread::hardware_concurrency())) {
    cmd.push_back("--oversubscribe");
  }
  // Ranks spread their threads over their share of the cores themselves.
  cmd.insert(cmd.end(), {"--bind-to", "none"});
  setenv("MASTER_ADDR", master.c_str(), 1);
  setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  for (const char* v : {"MASTER_ADDR", "MASTER_PORT"}) cmd.insert(cmd.end(), {"-x", v});
  if (!tp_timeout.empty()) {
    setenv("TFORMERS_TP_TIMEOUT", tp_timeout.c_str(), 1);
    cmd.insert(cmd.end(), {"-x", "TFORMERS_TP_TIMEOUT"});
  }
  std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  cmd.insert(cmd.end(), {self, kRankStep, "--"});
  for (int k = i + 1; k < argc; ++k) cmd.push_back(argv[k]);
  return run_mpirun(cmd);
}

}  // namespace tformers::distributed
