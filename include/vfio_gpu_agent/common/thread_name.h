// Names for the agent's threads, as `top -H`, `ps -L`, gdb and /proc/<pid>/task/*/comm show them, so an operator
// (and the soak's leak check) can tell the agent's threads from gRPC's and one of the agent's from another.
#pragma once

#include <string>
#include <string_view>

namespace vfio_agent {

// Names the calling thread; the kernel keeps 15 bytes, so a longer name is cut there rather than refused.
void NameThisThread(std::string_view name);

// The calling thread's name as the kernel has it.
std::string ThisThreadName();

}  // namespace vfio_agent
