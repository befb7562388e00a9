// A stand-in for NVIDIA's libnvfm.so.1 over an HGX 8-GPU board, with FM's real return codes and struct version
// checks. Its state lives in the file named by the connect address (fake_nvfm_state.h), so an agent process and
// the test that drives it share one Fabric Manager.
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

#include "fake_nvfm_state.h"
#include "vfio_gpu_agent/fabric/nvfm_api.h"

namespace nvfm = vfio_agent::fabric::nvfm;
using vfio_agent::testing::FakeFmLock;
using vfio_agent::testing::FakeFmState;

namespace {

struct Connection {
  std::string file;
  int epoch = 0;
};

bool g_initialized = false;

// FM's answer to any call on a connection, before the call's own work; kSuccess to go on. A partition call (every
// call but fmSetActivatedFabricPartitions) is refused while a restarted FM waits to be told what is active.
nvfm::Return Check(const Connection* connection, FakeFmState& state, bool partition_call) {
  if (connection == nullptr) return nvfm::kBadParam;
  vfio_agent::testing::ApplyFakeFmClock(state);
  if (state.dead || state.epoch != connection->epoch) return nvfm::kConnectionNotValid;
  if (state.mode == "not-configured") return nvfm::kNotConfigured;
  if (state.mode == "not-supported") return nvfm::kNotSupported;
  if (state.mode == "version-mismatch") return nvfm::kVersionMismatch;
  if (partition_call && state.awaiting_since_ms) return nvfm::kNotConfigured;
  return nvfm::kSuccess;
}

void Count(FakeFmState& state, const char* call) { ++state.counts[call]; }

// Write the (possibly zero) BDF as FM's NVML-style pciBusId.
void FormatBusId(const std::string& bdf, char* out, size_t size) {
  unsigned int domain = 0, bus = 0, device = 0, function = 0;
  std::sscanf(bdf.c_str(), "%x:%x:%x.%x", &domain, &bus, &device, &function);
  std::snprintf(out, size, "%08X:%02X:%02X.%X", domain, bus, device, function);
}

template <typename Fn>
nvfm::Return WithState(nvfm::Handle handle, Fn&& fn, bool partition_call = true) {
  auto* connection = static_cast<Connection*>(handle);
  if (connection == nullptr) return nvfm::kBadParam;
  FakeFmLock lock(connection->file);
  FakeFmState state = vfio_agent::testing::ReadFakeFm(connection->file);
  const nvfm::Return checked = Check(connection, state, partition_call);
  const nvfm::Return rc = checked == nvfm::kSuccess ? fn(state) : checked;
  vfio_agent::testing::WriteFakeFm(connection->file, state);
  return rc;
}

bool Overlap(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b) {
  for (uint32_t x : a) {
    for (uint32_t y : b) {
      if (x == y) return true;
    }
  }
  return false;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) nvfm::Return fmLibInit() {
  g_initialized = true;
  return nvfm::kSuccess;
}

__attribute__((visibility("default"))) nvfm::Return fmLibShutdown() {
  g_initialized = false;
  return nvfm::kSuccess;
}

__attribute__((visibility("default"))) nvfm::Return fmConnect(nvfm::ConnectParams* params, nvfm::Handle* handle) {
  if (!g_initialized) return nvfm::kUninitialized;
  if (params == nullptr || handle == nullptr) return nvfm::kBadParam;
  if (params->version != nvfm::kConnectParamsVersion) return nvfm::kVersionMismatch;
  if (params->addressType != nvfm::kAddressUnix || params->addressIsUnixSocket != 1) return nvfm::kConnectionNotValid;
  const std::string file(params->addressInfo, strnlen(params->addressInfo, sizeof params->addressInfo));
  if (!std::filesystem::exists(file)) return nvfm::kConnectionNotValid;  // no FM listening there
  FakeFmLock lock(file);
  FakeFmState state = vfio_agent::testing::ReadFakeFm(file);
  vfio_agent::testing::ApplyFakeFmClock(state);
  if (state.dead) {  // FM exited: nothing accepts the connection
    vfio_agent::testing::WriteFakeFm(file, state);
    return nvfm::kConnectionNotValid;
  }
  Count(state, "connect");
  vfio_agent::testing::WriteFakeFm(file, state);
  *handle = new Connection{file, state.epoch};
  return nvfm::kSuccess;
}

__attribute__((visibility("default"))) nvfm::Return fmDisconnect(nvfm::Handle handle) {
  delete static_cast<Connection*>(handle);
  return nvfm::kSuccess;
}

__attribute__((visibility("default"))) nvfm::Return fmGetSupportedFabricPartitions(nvfm::Handle handle,
                                                                                    nvfm::PartitionList* list) {
  if (list == nullptr) return nvfm::kBadParam;
  if (list->version != nvfm::kPartitionListVersion) return nvfm::kVersionMismatch;
  return WithState(handle, [&](FakeFmState& state) {
    Count(state, "get_supported");
    const auto partitions = vfio_agent::testing::FakeHgxPartitions();
    list->numPartitions = static_cast<unsigned int>(partitions.size());
    list->maxNumPartitions = nvfm::kMaxFabricPartitions;
    for (size_t id = 0; id < partitions.size(); ++id) {
      nvfm::PartitionInfo& info = list->partitionInfo[id];
      info.partitionId = static_cast<unsigned int>(id);
      info.isActive = state.active.contains(static_cast<uint32_t>(id)) ? 1 : 0;
      if (auto value = state.is_active.find(static_cast<uint32_t>(id)); value != state.is_active.end()) {
        info.isActive = value->second;
      }
      info.numGpus = static_cast<unsigned int>(partitions[id].size());
      for (size_t g = 0; g < partitions[id].size(); ++g) {
        nvfm::PartitionGpuInfo& gpu = info.gpuInfo[g];
        gpu.physicalId = partitions[id][g];
        std::snprintf(gpu.uuid, sizeof gpu.uuid, "GPU-fake-%u", gpu.physicalId);
        FormatBusId(state.gpus[gpu.physicalId], gpu.pciBusId, sizeof gpu.pciBusId);
        gpu.numNvLinksAvailable = gpu.maxNumNvLinks = 18;
        gpu.nvlinkLineRateMBps = 26562;
      }
    }
    return nvfm::kSuccess;
  });
}

__attribute__((visibility("default"))) nvfm::Return fmGetUnsupportedFabricPartitions(
    nvfm::Handle handle, nvfm::UnsupportedPartitionList* list) {
  if (list == nullptr) return nvfm::kBadParam;
  if (list->version != nvfm::kUnsupportedPartitionListVersion) return nvfm::kVersionMismatch;
  return WithState(handle, [&](FakeFmState& state) {
    const auto partitions = vfio_agent::testing::FakeHgxPartitions();
    list->numPartitions = 0;
    for (uint32_t id : state.unsupported) {
      nvfm::UnsupportedPartitionInfo& info = list->partitionInfo[list->numPartitions++];
      info.partitionId = id;
      info.numGpus = id < partitions.size() ? static_cast<unsigned int>(partitions[id].size()) : 0;
      for (unsigned int g = 0; g < info.numGpus; ++g) info.gpuPhysicalIds[g] = partitions[id][g];
    }
    return nvfm::kSuccess;
  });
}

__attribute__((visibility("default"))) nvfm::Return fmActivateFabricPartition(nvfm::Handle handle,
                                                                               nvfm::PartitionId id) {
  return WithState(handle, [&](FakeFmState& state) {
    Count(state, "activate");
    const auto partitions = vfio_agent::testing::FakeHgxPartitions();
    if (id >= partitions.size() || state.unsupported.contains(id)) return nvfm::kBadParam;
    if (state.active.contains(id)) return nvfm::kInUse;
    for (uint32_t other : state.active) {
      if (Overlap(partitions[other], partitions[id])) return nvfm::kInUse;  // a GPU of it is in another partition
    }
    if (auto it = state.fail.find(id); it != state.fail.end()) return it->second;
    state.active.insert(id);
    return nvfm::kSuccess;
  });
}

__attribute__((visibility("default"))) nvfm::Return fmDeactivateFabricPartition(nvfm::Handle handle,
                                                                                 nvfm::PartitionId id) {
  return WithState(handle, [&](FakeFmState& state) {
    Count(state, "deactivate");
    if (id >= vfio_agent::testing::FakeHgxPartitions().size()) return nvfm::kBadParam;
    if (state.active.erase(id) == 0) return nvfm::kUninitialized;
    return nvfm::kSuccess;
  });
}

__attribute__((visibility("default"))) nvfm::Return fmSetActivatedFabricPartitions(
    nvfm::Handle handle, nvfm::ActivatedPartitionList* list) {
  if (list == nullptr) return nvfm::kBadParam;
  if (list->version != nvfm::kActivatedPartitionListVersion) return nvfm::kVersionMismatch;
  return WithState(handle, [&](FakeFmState& state) {
    Count(state, "set_activated");
    if (list->numPartitions > nvfm::kMaxFabricPartitions) return nvfm::kBadParam;
    const auto partitions = vfio_agent::testing::FakeHgxPartitions();
    std::vector<uint32_t> told(list->partitionIds, list->partitionIds + list->numPartitions);
    for (size_t i = 0; i < told.size(); ++i) {
      if (told[i] >= partitions.size() || state.unsupported.contains(told[i])) return nvfm::kBadParam;
      // Two active partitions never share a GPU: FM takes no such list.
      for (size_t j = 0; j < i; ++j) {
        if (Overlap(partitions[told[i]], partitions[told[j]])) return nvfm::kBadParam;
      }
    }
    state.told = told;
    state.told_any = true;
    // FM takes the list as what is active; a restart's refusal window ends with it.
    state.awaiting_since_ms.reset();
    state.active = {told.begin(), told.end()};
    return nvfm::kSuccess;
  }, /*partition_call=*/false);
}

}  // extern "C"
