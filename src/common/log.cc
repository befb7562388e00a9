#include "vfio_gpu_agent/common/log.h"

#include <string>

#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/spdlog.h"

namespace vfio_agent {

void InitLogging(std::string_view level) {
  constexpr const char* kName = "vfio-gpu-agent";
  auto logger = spdlog::get(kName);
  if (!logger) {
    logger = spdlog::stderr_logger_mt(kName);
    logger->set_pattern("%Y-%m-%dT%H:%M:%S.%eZ %l %v", spdlog::pattern_time_type::utc);
    spdlog::set_default_logger(logger);
  }
  auto parsed = spdlog::level::from_str(std::string(level));
  // from_str maps every unknown string to `off`; only an explicit "off" should silence the agent.
  if (parsed == spdlog::level::off && level != "off") parsed = spdlog::level::info;
  logger->set_level(parsed);
}

}  // namespace vfio_agent
