// Anonymous resident memory of a process, for the benchmarks' growth figures.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

namespace vfio_agent::bench {

// RssAnon of /proc/<pid>/status in kB (this process by default); -1 when unreadable.
inline int64_t RssAnonKb(const std::string& pid = "self") {
  std::ifstream status("/proc/" + pid + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("RssAnon:", 0) == 0) return std::stoll(line.substr(8));
  }
  return -1;
}

}  // namespace vfio_agent::bench
