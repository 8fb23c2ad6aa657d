// What a rank does when the launcher dies, and where the reason a job ends is written. Neither
// needs MPI: end_with_parent() is plain process control, and write_fatal_line() plain output.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "distributed/launcher.h"
#include "distributed/process_group.h"

namespace tformers::distributed {
namespace {

// A stands for mpirun, B for a rank that runs the user's command (here `sleep 60`). Killing A
// must end B; before end_with_parent, B slept on as an orphan. This process is made the
// subreaper, so that the orphan B comes to it and its end can be waited for (at most 20 s).
TEST(Launcher, ARankEndsWhenTheLauncherIsKilled) {
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t a = fork();
  ASSERT_GE(a, 0);
  if (a == 0) {
    const pid_t b = fork();
    if (b == 0) {
      end_with_parent();
      const pid_t self = getpid();
      if (write(ready[1], &self, sizeof self) != sizeof self) _exit(126);
      execlp("sleep", "sleep", "60", static_cast<char*>(nullptr));
      _exit(127);
    }
    for (;;) pause();  // until the test kills it
  }
  close(ready[1]);
  pid_t b = 0;
  ASSERT_EQ(read(ready[0], &b, sizeof b), ssize_t(sizeof b));
  close(ready[0]);
  ASSERT_EQ(kill(a, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(a, &status, 0), a);
  int b_status = 0;
  bool ended = false;
  for (int i = 0; i < 200 && !ended; ++i) {
    ended = waitpid(b, &b_status, WNOHANG) == b;
    if (!ended) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!ended) {
    kill(b, SIGKILL);
    waitpid(b, &b_status, 0);
  }
  prctl(PR_SET_CHILD_SUBREAPER, 0);
  ASSERT_TRUE(ended) << "the rank outlived its launcher";
  EXPECT_TRUE(WIFSIGNALED(b_status) && WTERMSIG(b_status) == SIGTERM) << b_status;
}

bool g_released = false;
void note_release() { g_released = true; }

// The line that says why the job ends goes to the descriptor set, after the hook that releases
// held stderr: on rank 0 it went into the held file, on the others to /dev/null, and MPI_Abort
// followed, so the user never saw it.
TEST(Launcher, FatalLineGoesPastHeldAndSilencedStderr) {
  char path[] = "/tmp/tformers_fatal_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  set_fatal_output(fd, &note_release);
  write_fatal_line("tformers: rank %d: collective %s got no answer\n", 1, "all_reduce");
  set_fatal_output(2, nullptr);
  EXPECT_TRUE(g_released);
  char buf[256] = {};
  ASSERT_GT(pread(fd, buf, sizeof buf - 1, 0), 0);
  close(fd);
  unlink(path);
  EXPECT_STREQ(buf, "tformers: rank 1: collective all_reduce got no answer\n");
}

}  // namespace
}  // namespace tformers::distributed
