// The kubelet APIs in proto/ must stay wire-identical to Kubernetes v1.36: the full gRPC method paths the
// kubelet calls and the field numbers of every message field we read or write.
#include <gtest/gtest.h>

#include "dra-health/v1/api.pb.h"
#include "dra-health/v1alpha1/api.pb.h"
#include "dra/v1/api.grpc.pb.h"
#include "dra/v1beta1/api.grpc.pb.h"
#include "google/protobuf/descriptor.h"
#include "pluginregistration/v1/api.grpc.pb.h"

namespace vfio_agent::dra {
namespace {

using google::protobuf::DescriptorPool;

std::string MethodPath(const std::string& service, const std::string& method) {
  const auto* descriptor = DescriptorPool::generated_pool()->FindServiceByName(service);
  if (descriptor == nullptr || descriptor->FindMethodByName(method) == nullptr) return "";
  return "/" + descriptor->full_name() + "/" + method;
}

int FieldNumber(const std::string& message, const std::string& field) {
  const auto* descriptor = DescriptorPool::generated_pool()->FindMessageTypeByName(message);
  if (descriptor == nullptr || descriptor->FindFieldByName(field) == nullptr) return -1;
  return descriptor->FindFieldByName(field)->number();
}

TEST(KubeletApiProtoTest, MethodPathsAreTheKubelets) {
  EXPECT_EQ(MethodPath("pluginregistration.Registration", "GetInfo"), "/pluginregistration.Registration/GetInfo");
  EXPECT_EQ(MethodPath("pluginregistration.Registration", "NotifyRegistrationStatus"),
            "/pluginregistration.Registration/NotifyRegistrationStatus");
  for (const std::string version : {"v1", "v1beta1"}) {
    const std::string service = "k8s.io.kubelet.pkg.apis.dra." + version + ".DRAPlugin";
    EXPECT_EQ(MethodPath(service, "NodePrepareResources"), "/" + service + "/NodePrepareResources");
    EXPECT_EQ(MethodPath(service, "NodeUnprepareResources"), "/" + service + "/NodeUnprepareResources");
  }
  EXPECT_EQ(MethodPath("v1alpha1.DRAResourceHealth", "NodeWatchResources"), "/v1alpha1.DRAResourceHealth/NodeWatchResources");
  EXPECT_EQ(MethodPath("v1.DRAResourceHealth", "NodeWatchResources"), "/v1.DRAResourceHealth/NodeWatchResources");
}

TEST(KubeletApiProtoTest, FieldNumbersAreTheKubelets) {
  EXPECT_EQ(FieldNumber("pluginregistration.PluginInfo", "type"), 1);
  EXPECT_EQ(FieldNumber("pluginregistration.PluginInfo", "name"), 2);
  EXPECT_EQ(FieldNumber("pluginregistration.PluginInfo", "endpoint"), 3);
  EXPECT_EQ(FieldNumber("pluginregistration.PluginInfo", "supported_versions"), 4);
  EXPECT_EQ(FieldNumber("pluginregistration.RegistrationStatus", "plugin_registered"), 1);
  EXPECT_EQ(FieldNumber("pluginregistration.RegistrationStatus", "error"), 2);
  for (const std::string version : {"v1", "v1beta1"}) {
    const std::string p = "k8s.io.kubelet.pkg.apis.dra." + version + ".";
    EXPECT_EQ(FieldNumber(p + "Claim", "namespace"), 1);
    EXPECT_EQ(FieldNumber(p + "Claim", "uid"), 2);
    EXPECT_EQ(FieldNumber(p + "Claim", "name"), 3);
    EXPECT_EQ(FieldNumber(p + "NodePrepareResourcesRequest", "claims"), 1);
    EXPECT_EQ(FieldNumber(p + "NodePrepareResourcesResponse", "claims"), 1);
    EXPECT_EQ(FieldNumber(p + "NodePrepareResourceResponse", "devices"), 1);
    EXPECT_EQ(FieldNumber(p + "NodePrepareResourceResponse", "error"), 2);
    EXPECT_EQ(FieldNumber(p + "Device", "request_names"), 1);
    EXPECT_EQ(FieldNumber(p + "Device", "pool_name"), 2);
    EXPECT_EQ(FieldNumber(p + "Device", "device_name"), 3);
    EXPECT_EQ(FieldNumber(p + "Device", "cdi_device_ids"), 4);
    EXPECT_EQ(FieldNumber(p + "NodeUnprepareResourcesRequest", "claims"), 1);
    EXPECT_EQ(FieldNumber(p + "NodeUnprepareResourcesResponse", "claims"), 1);
    EXPECT_EQ(FieldNumber(p + "NodeUnprepareResourceResponse", "error"), 1);
  }
  EXPECT_EQ(FieldNumber("k8s.io.kubelet.pkg.apis.dra.v1.Device", "share_id"), 5);
  EXPECT_EQ(FieldNumber("k8s.io.kubelet.pkg.apis.dra.v1beta1.Device", "share_id"), -1);
  EXPECT_EQ(FieldNumber("v1alpha1.DeviceIdentifier", "pool_name"), 1);
  EXPECT_EQ(FieldNumber("v1alpha1.DeviceIdentifier", "device_name"), 2);
  EXPECT_EQ(FieldNumber("v1alpha1.DeviceHealth", "device"), 1);
  EXPECT_EQ(FieldNumber("v1alpha1.DeviceHealth", "health"), 2);
  EXPECT_EQ(FieldNumber("v1alpha1.DeviceHealth", "last_updated_time"), 3);
  EXPECT_EQ(FieldNumber("v1alpha1.DeviceHealth", "health_check_timeout_seconds"), 4);
  EXPECT_EQ(FieldNumber("v1alpha1.DeviceHealth", "message"), 5);
  EXPECT_EQ(FieldNumber("v1alpha1.NodeWatchResourcesResponse", "devices"), 1);
  for (const std::string p : {"v1alpha1.", "v1."}) {
    EXPECT_EQ(FieldNumber(p + "DeviceIdentifier", "pool_name"), 1);
    EXPECT_EQ(FieldNumber(p + "DeviceIdentifier", "device_name"), 2);
    EXPECT_EQ(FieldNumber(p + "DeviceHealth", "device"), 1);
    EXPECT_EQ(FieldNumber(p + "DeviceHealth", "health"), 2);
    EXPECT_EQ(FieldNumber(p + "DeviceHealth", "last_updated_time"), 3);
    EXPECT_EQ(FieldNumber(p + "DeviceHealth", "health_check_timeout_seconds"), 4);
    EXPECT_EQ(FieldNumber(p + "DeviceHealth", "message"), 5);
    EXPECT_EQ(FieldNumber(p + "NodeWatchResourcesResponse", "devices"), 1);
  }
  EXPECT_EQ(static_cast<int>(::v1::UNHEALTHY), static_cast<int>(v1alpha1::UNHEALTHY));
  EXPECT_EQ(v1alpha1::HealthStatus_Name(v1alpha1::UNHEALTHY), "UNHEALTHY");
  EXPECT_EQ(static_cast<int>(v1alpha1::UNHEALTHY), 2);
}

}  // namespace
}  // namespace vfio_agent::dra
