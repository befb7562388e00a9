#include "support/holding_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace vfio_agent::testing {

HoldingProcess::HoldingProcess(const std::filesystem::path& path) {
  int ready[2];
  if (pipe(ready) != 0) {
    std::perror("HoldingProcess: pipe");
    std::abort();
  }
  pid_ = fork();
  if (pid_ == 0) {
    const int fd = open(path.c_str(), O_RDONLY);
    (void)!write(ready[1], fd >= 0 ? "y" : "n", 1);
    pause();
    _exit(0);
  }
  char c = 0;
  const bool opened = read(ready[0], &c, 1) == 1 && c == 'y';
  close(ready[0]);
  close(ready[1]);
  if (!opened) {
    std::fprintf(stderr, "HoldingProcess: child could not open %s\n", path.c_str());
    std::abort();
  }
}

HoldingProcess::~HoldingProcess() {
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
}

}  // namespace vfio_agent::testing
