// Which Register failures wait 30 s (the kubelet refused the request) and which retry at once.
#include "gtest/gtest.h"
#include "resource_server.h"

namespace vfio_agent::plugin::internal {
namespace {

TEST(RegisterErrorTest, OnlyAWrongVersionOrNameIsAConfigurationError) {
  // The kubelet's own messages (reference R1, R2), all with status UNKNOWN.
  EXPECT_TRUE(IsRegisterConfigError(grpc::Status(
      grpc::StatusCode::UNKNOWN,
      "requested API version \"v1alpha\" is not supported by kubelet. Supported versions are [\"v1beta1\"]")));
  EXPECT_TRUE(IsRegisterConfigError(
      grpc::Status(grpc::StatusCode::UNKNOWN, "the ResourceName \"nvidia.com/A B\" is invalid")));
}

TEST(RegisterErrorTest, EveryOtherUnknownIsTransient) {
  for (const char* message : {"failed to dial device plugin: context deadline exceeded",
                              "failed to get device plugin options: rpc error: code = Unavailable",
                              "failed to dial device plugin: context canceled", ""}) {
    EXPECT_FALSE(IsRegisterConfigError(grpc::Status(grpc::StatusCode::UNKNOWN, message))) << message;
  }
  // A version message under another code is not the kubelet's answer.
  EXPECT_FALSE(IsRegisterConfigError(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the ResourceName \"x\" is invalid")));
}

}  // namespace
}  // namespace vfio_agent::plugin::internal
