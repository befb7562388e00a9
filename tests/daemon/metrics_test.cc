// The daemon's metrics (src/daemon/metrics.cc: prometheus-cpp, served by its civetweb exposer) as a scraper reads
// them over HTTP: sorted labels, escaping, histograms, replaced label sets, families with no sample listed by their
// HELP and TYPE lines (AllFamilies), other paths, a taken port, and a stop with a silent client connected.
#include "metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "support/ports.h"

namespace vfio_agent::daemon::internal {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// Sends `request` to 127.0.0.1:port and reads the answer until the server closes; "" when it cannot connect.
std::string Fetch(int port, const std::string& request) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string answer;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0 &&
      ::send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size())) {
    char buffer[4096];
    for (ssize_t n; (n = ::recv(fd, buffer, sizeof buffer, 0)) > 0;) answer.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return answer;
}

// Connects and closes without a request.
void ConnectAndLeave(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  (void)::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address);
  ::close(fd);
}

std::string Scrape(int port) { return Fetch(port, "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n"); }

class MetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    port_ = vfio_agent::testing::UnusedLoopbackPort();
    ASSERT_TRUE(metrics_.Listen("127.0.0.1", port_).ok());
  }
  Metrics metrics_;
  int port_ = 0;
};

TEST_F(MetricsTest, ScrapeHasEachTypeAndEveryFamily) {
  metrics_.CountBind("bound");
  metrics_.CountBind("bound");
  metrics_.CountPartitionActivation(false, "FM_ST_NOT_CONFIGURED");
  metrics_.OnAllocate("nvidia.com/GH100", true, std::chrono::microseconds(50));
  const std::string scrape = Scrape(port_);
  EXPECT_THAT(scrape, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(scrape, HasSubstr("\n# HELP vfio_gpu_agent_binds_total Bind attempts of one function by outcome\n"
                                "# TYPE vfio_gpu_agent_binds_total counter\n"
                                "vfio_gpu_agent_binds_total{outcome=\"bound\"} 2\n"));
  // Labels by name, whatever order the call gave them in.
  EXPECT_THAT(scrape, HasSubstr("\nvfio_gpu_agent_fabric_partition_activations_total{fm_status=\"FM_ST_NOT_CONFIGURED\","
                                "result=\"failed\"} 1\n"));
  // A histogram: count, sum, then cumulative buckets with le last, +Inf included.
  EXPECT_THAT(scrape, HasSubstr("\nvfio_gpu_agent_allocate_duration_seconds_count{resource=\"nvidia.com/GH100\"} 1\n"
                                "vfio_gpu_agent_allocate_duration_seconds_sum{resource=\"nvidia.com/GH100\"} 5e-05\n"
                                "vfio_gpu_agent_allocate_duration_seconds_bucket{resource=\"nvidia.com/GH100\",le=\"1e-05\"} 0\n"
                                "vfio_gpu_agent_allocate_duration_seconds_bucket{resource=\"nvidia.com/GH100\",le=\"3e-05\"} 0\n"
                                "vfio_gpu_agent_allocate_duration_seconds_bucket{resource=\"nvidia.com/GH100\",le=\"0.0001\"} 1\n"));
  EXPECT_THAT(scrape, HasSubstr("vfio_gpu_agent_allocate_duration_seconds_bucket{resource=\"nvidia.com/GH100\",le=\"+Inf\"} 1\n"));
  // Without labels, present from the start.
  EXPECT_THAT(scrape, HasSubstr("\nvfio_gpu_agent_kubelet_restarts_total 0\n"));
  EXPECT_THAT(scrape, HasSubstr("\nvfio_gpu_agent_start_time_seconds 1"));
  // A family with no sample yet: its HELP and TYPE alone.
  EXPECT_THAT(scrape, HasSubstr("\n# TYPE vfio_gpu_agent_dra_prepare_duration_seconds histogram\n"));
  EXPECT_THAT(scrape, Not(HasSubstr("vfio_gpu_agent_dra_prepare_duration_seconds_count")));
}

TEST_F(MetricsTest, LabelValuesAreEscapedAndReplacedSetsLeaveNoOldSeries) {
  metrics_.CountBindFailure("held by \"qemu\" at C:\\vm\nand more");
  metrics_.SetDevices({{{"nvidia.com/A", "healthy"}, 2}, {{"nvidia.com/A", "unbound"}, 1}});
  metrics_.SetDevices({{{"nvidia.com/A", "healthy"}, 3}});
  metrics_.SetReady(false, "devices.bound");
  metrics_.SetReady(false, "kubelet.registered");
  const std::string scrape = Scrape(port_);
  EXPECT_THAT(scrape, HasSubstr("vfio_gpu_agent_bind_failures_total{reason=\"held by \\\"qemu\\\" at C:\\\\vm\\nand "
                                "more\"} 1\n"));
  EXPECT_THAT(scrape, HasSubstr("vfio_gpu_agent_devices{resource=\"nvidia.com/A\",state=\"healthy\"} 3\n"));
  EXPECT_THAT(scrape, Not(HasSubstr("state=\"unbound\"")));
  EXPECT_THAT(scrape, HasSubstr("vfio_gpu_agent_not_ready{check=\"kubelet.registered\"} 1\n"));
  EXPECT_THAT(scrape, Not(HasSubstr("devices.bound")));
  EXPECT_THAT(scrape, HasSubstr("\nvfio_gpu_agent_ready 0\n"));
}

TEST_F(MetricsTest, OtherPathsAreNotFound) {
  EXPECT_THAT(Fetch(port_, "GET / HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.1 404 Not Found\r\n"));
  // One answered after a client that sent nothing and left: the server is not stuck on it.
  ConnectAndLeave(port_);
  EXPECT_THAT(Scrape(port_), HasSubstr("# TYPE vfio_gpu_agent_ready gauge"));
}

TEST(MetricsListenTest, ATakenPortIsAnErrorNamingTheAddress) {
  const int port = vfio_agent::testing::UnusedLoopbackPort();
  Metrics first;
  ASSERT_TRUE(first.Listen("127.0.0.1", port).ok());
  Metrics second;
  const absl::Status status = second.Listen("127.0.0.1", port);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(status.message()), HasSubstr("metrics on 127.0.0.1:" + std::to_string(port)));
}

// Stopping with a client connected that sends nothing returns (ctest's timeout would catch a hang). Whether civetweb
// closes that connection is not asked: one its listener accepted but no worker took yet stays open after mg_stop,
// and a read of it would block forever (seen on a loaded machine); `run` stops its metrics only as it exits.
TEST(MetricsListenTest, StopsWithASilentClientConnected) {
  const int port = vfio_agent::testing::UnusedLoopbackPort();
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  {
    Metrics metrics;
    ASSERT_TRUE(metrics.Listen("127.0.0.1", port).ok());
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address), 0);
  }
  ::close(fd);
}

}  // namespace
}  // namespace vfio_agent::daemon::internal
