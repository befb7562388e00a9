// sysfs-sim --node FILE --root DIR: mounts a kernel-like sysfs at DIR/sys (FUSE), maintains DIR/dev and writes
// DIR/proc/{cmdline,cpuinfo}.
// Prints "READY DIR" once mounted; SIGTERM/SIGINT unmount and exit 0.
#include <pthread.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "fuse_fs.h"
#include "kernel.h"
#include "node_spec.h"
#include "spdlog/spdlog.h"
#include "vfio_gpu_agent/common/log.h"

namespace {

namespace fs = std::filesystem;
using vfio_agent::sim::FuseFs;
using vfio_agent::sim::Kernel;

constexpr const char* kUsage =
    "usage: sysfs-sim --node FILE --root DIR\n"
    "Mounts a simulated sysfs described by FILE (proto/sim/v1/node.proto, JSON) at DIR/sys, keeps\n"
    "DIR/dev in step and writes DIR/proc/{cmdline,cpuinfo}. Prints \"READY DIR\" when mounted; SIGTERM or\n"
    "SIGINT unmounts and exits 0.\n"
    "Control: write commands to DIR/sys/.sim/control; DIR/sys/.sim/log lists the writes the sim saw.\n";

bool ParseArgs(int argc, char** argv, std::string& node, std::string& root) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto take = [&](const char* flag, std::string& out) {
      const std::string prefix = std::string(flag) + "=";
      if (arg == flag && i + 1 < argc) {
        out = argv[++i];
        return true;
      }
      if (arg.rfind(prefix, 0) == 0) {
        out = arg.substr(prefix.size());
        return true;
      }
      return false;
    };
    if (!take("--node", node) && !take("--root", root)) return false;
  }
  return !node.empty() && !root.empty();
}

// A leftover mount of a crashed sim answers ENOTCONN; detach it so the new one can mount.
bool PrepareMountpoint(const fs::path& mountpoint) {
  struct stat st {};
  if (stat(mountpoint.c_str(), &st) != 0 && errno == ENOTCONN) umount2(mountpoint.c_str(), MNT_DETACH);
  std::error_code ec;
  fs::create_directories(mountpoint, ec);
  if (ec) spdlog::error("sysfs-sim: create {}: {}", mountpoint.string(), ec.message());
  return !ec;
}

}  // namespace

int main(int argc, char** argv) {
  vfio_agent::InitLogging("info");
  std::string node_file, root_arg;
  if (!ParseArgs(argc, argv, node_file, root_arg)) {
    std::cerr << kUsage;
    return 2;
  }
  auto node = vfio_agent::sim::LoadNode(node_file);
  if (!node.ok()) {
    spdlog::error("sysfs-sim: {}", node.status().ToString());
    return 2;
  }
  const fs::path root = fs::absolute(root_arg);
  const fs::path mountpoint = root / "sys";
  if (!PrepareMountpoint(mountpoint)) return 1;

  // Signals are taken by one thread with sigwait(), so FUSE workers never see EINTR.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) sigaddset(&stop_signals, sig);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  Kernel kernel(*std::move(node), root / "dev", root / "proc");
  if (auto st = kernel.Start(); !st.ok()) {
    spdlog::error("sysfs-sim: {}", st.ToString());
    return 1;
  }
  FuseFs fs_impl(kernel);
  std::vector<std::string> args_storage = {"sysfs-sim", "-o", "fsname=sysfs-sim,subtype=sysfs-sim"};
  std::vector<char*> args_ptrs;
  for (auto& a : args_storage) args_ptrs.push_back(a.data());
  fuse_args args = FUSE_ARGS_INIT(static_cast<int>(args_ptrs.size()), args_ptrs.data());
  fuse_session* se = fuse_session_new(&args, &FuseFs::Ops(), sizeof(fuse_lowlevel_ops), &fs_impl);
  fuse_opt_free_args(&args);
  if (!se || fuse_session_mount(se, mountpoint.c_str()) != 0) {
    spdlog::error("sysfs-sim: cannot mount FUSE at {}", mountpoint.string());
    return 1;
  }

  // Shutdown must not go through the filesystem: a request sent to our own mount during the loop's
  // teardown can be read by a worker that is then cancelled, and would never be answered. The loop's
  // main thread waits in sem_wait(), which any handled signal interrupts.
  struct sigaction wake {};
  wake.sa_handler = [](int) {};
  sigaction(SIGUSR1, &wake, nullptr);
  const pthread_t loop_thread = pthread_self();
  std::atomic<bool> stopping = false;
  std::atomic<bool> loop_done = false;
  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    if (loop_done) return;  // woken by main after an external unmount
    stopping = true;
    kernel.Shutdown();  // blocked unbinds return, so the loop can join its workers
    fuse_session_exit(se);
    while (!loop_done) {  // repeated: the first one may land just before sem_wait()
      pthread_kill(loop_thread, SIGUSR1);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });

  std::printf("READY %s\n", root_arg.c_str());
  std::fflush(stdout);

  fuse_loop_config* config = fuse_loop_cfg_create();
  fuse_loop_cfg_set_max_threads(config, 256);  // every blocked unbind holds a worker
  const int rc = fuse_session_loop_mt(se, config);
  loop_done = true;
  fuse_loop_cfg_destroy(config);
  fuse_session_unmount(se);
  fuse_session_destroy(se);
  if (!stopping) pthread_kill(signal_thread.native_handle(), SIGTERM);
  signal_thread.join();
  return stopping ? 0 : (rc == 0 ? 0 : 1);
}
