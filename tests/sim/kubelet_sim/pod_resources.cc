// Pod-resources v1 server (reference section 1.3, section 3 item 12): healthy-only allocatable devices and
// one ContainerDevices per (device, NUMA node) pair, as the kubelet reports them.
#include "absl/strings/str_format.h"
#include "kubelet_sim_impl.h"

namespace vfio_agent::kubeletsim {
namespace {

class PodResourcesService final : public ::v1::PodResourcesLister::Service {
 public:
  using Filler = std::function<void(::v1::ListPodResourcesResponse*)>;
  using AllocFiller = std::function<void(::v1::AllocatableResourcesResponse*)>;
  using Getter = std::function<grpc::Status(const ::v1::GetPodResourcesRequest&, ::v1::GetPodResourcesResponse*)>;
  PodResourcesService(Filler list, AllocFiller allocatable, Getter get, std::function<bool()> list_unavailable)
      : list_(std::move(list)),
        allocatable_(std::move(allocatable)),
        get_(std::move(get)),
        list_unavailable_(std::move(list_unavailable)) {}

  grpc::Status List(grpc::ServerContext*, const ::v1::ListPodResourcesRequest*,
                    ::v1::ListPodResourcesResponse* response) override {
    if (list_unavailable_ && list_unavailable_()) return {grpc::StatusCode::UNAVAILABLE, "List not ready yet"};
    list_(response);
    return grpc::Status::OK;
  }
  grpc::Status GetAllocatableResources(grpc::ServerContext*, const ::v1::AllocatableResourcesRequest*,
                                       ::v1::AllocatableResourcesResponse* response) override {
    allocatable_(response);
    return grpc::Status::OK;
  }
  grpc::Status Get(grpc::ServerContext*, const ::v1::GetPodResourcesRequest* request,
                   ::v1::GetPodResourcesResponse* response) override {
    return get_(*request, response);
  }

 private:
  Filler list_;
  AllocFiller allocatable_;
  Getter get_;
  std::function<bool()> list_unavailable_;
};

}  // namespace

std::unique_ptr<grpc::Service> KubeletSim::Impl::MakePodResourcesService(const Impl* impl) {
  return std::make_unique<PodResourcesService>(
      [impl](::v1::ListPodResourcesResponse* out) { impl->FillList(out); },
      [impl](::v1::AllocatableResourcesResponse* out) { impl->FillAllocatable(out); },
      [impl](const ::v1::GetPodResourcesRequest& request, ::v1::GetPodResourcesResponse* out) {
        return impl->FillGet(request, out);
      },
      [impl] { return impl->options_.list_unavailable && impl->options_.list_unavailable(); });
}

void KubeletSim::Impl::AppendDevices(const std::string& resource, const std::vector<std::string>& ids,
                                     const std::map<std::string, std::vector<int64_t>>& topology,
                                     google::protobuf::RepeatedPtrField<::v1::ContainerDevices>* out) const {
  for (const auto& id : ids) {
    auto it = topology.find(id);
    if (it == topology.end() || it->second.empty()) {
      auto* devices = out->Add();
      devices->set_resource_name(resource);
      devices->add_device_ids(id);
      continue;
    }
    for (int64_t node : it->second) {
      auto* devices = out->Add();
      devices->set_resource_name(resource);
      devices->add_device_ids(id);
      devices->mutable_topology()->add_nodes()->set_id(node);
    }
  }
}

void KubeletSim::Impl::FillAllocatable(::v1::AllocatableResourcesResponse* out) const {
  std::lock_guard lock(mu_);
  ExpireGraceLocked();
  for (const auto& [name, entry] : resources_) {
    AppendDevices(name, {entry.healthy.begin(), entry.healthy.end()}, entry.topology, out->mutable_devices());
  }
}

namespace {
void FillPod(const AdmittedPod& pod, const std::map<std::string, ResourceEntry>& resources,
             const std::function<void(const std::string&, const std::vector<std::string>&,
                                      const std::map<std::string, std::vector<int64_t>>&,
                                      google::protobuf::RepeatedPtrField<::v1::ContainerDevices>*)>& append,
             ::v1::PodResources* out) {
  out->set_name(pod.name);
  out->set_namespace_(pod.pod_namespace);
  auto* container = out->add_containers();
  container->set_name(pod.container);
  for (const auto& [resource, ids] : pod.devices) {
    static const std::map<std::string, std::vector<int64_t>> kNoTopology;
    auto it = resources.find(resource);
    append(resource, ids, it == resources.end() ? kNoTopology : it->second.topology, container->mutable_devices());
  }
}
}  // namespace

void KubeletSim::Impl::FillList(::v1::ListPodResourcesResponse* out) const {
  std::lock_guard lock(mu_);
  auto append = [this](auto&&... args) { AppendDevices(args...); };
  for (const auto& [name, pod] : pods_) FillPod(pod, resources_, append, out->add_pod_resources());
}

grpc::Status KubeletSim::Impl::FillGet(const ::v1::GetPodResourcesRequest& request,
                                       ::v1::GetPodResourcesResponse* out) const {
  std::lock_guard lock(mu_);
  auto it = pods_.find(request.pod_name());
  if (it == pods_.end() || it->second.pod_namespace != request.pod_namespace()) {
    return grpc::Status(grpc::StatusCode::UNKNOWN, absl::StrFormat("pod %s in namespace %s not found",
                                                                   request.pod_name(), request.pod_namespace()));
  }
  auto append = [this](auto&&... args) { AppendDevices(args...); };
  FillPod(it->second, resources_, append, out->mutable_pod_resources());
  return grpc::Status::OK;
}

}  // namespace vfio_agent::kubeletsim
