// The C interface of NVIDIA Fabric Manager's client library (libnvfm.so.1, SDK headers nv_fm_agent.h and
// nv_fm_types.h), declared here from its documented interface so that the agent needs neither the SDK nor
// the library at build time: the library is opened at run time where Fabric Manager is installed. The
// layouts are ABI: every struct below must stay byte-identical to the SDK's.
#pragma once

#include <cstdint>

namespace vfio_agent::fabric::nvfm {

// fmReturn_t (an enum of int size in the SDK).
using Return = int;
inline constexpr Return kSuccess = 0;
inline constexpr Return kBadParam = -1;
inline constexpr Return kGenericError = -2;
inline constexpr Return kNotSupported = -3;
inline constexpr Return kUninitialized = -4;
inline constexpr Return kTimeout = -5;
inline constexpr Return kVersionMismatch = -6;
inline constexpr Return kInUse = -7;
inline constexpr Return kNotConfigured = -8;
inline constexpr Return kConnectionNotValid = -9;
inline constexpr Return kNvlinkError = -10;
inline constexpr Return kNotReady = -22;
// The names FM's documentation and logs use ("FM_ST_IN_USE"); "FM_ST_<n>" for codes not listed above.
const char* ReturnName(Return code);

using Handle = void*;
using PartitionId = unsigned int;

inline constexpr int kMaxStrLength = 256;
inline constexpr int kUuidBufferSize = 80;
inline constexpr int kPciBusIdBufferSize = 32;
inline constexpr int kMaxNumGpus = 16;
inline constexpr int kMaxFabricPartitions = 64;
inline constexpr int kDefaultPort = 6666;

// MAKE_FM_PARAM_VERSION: a versioned struct carries its size in the low 24 bits.
template <typename T>
constexpr unsigned int ParamVersion(unsigned int version) {
  return static_cast<unsigned int>(sizeof(T)) | (version << 24);
}

enum AddressType : int { kAddressUnknown = 0, kAddressInet = 1, kAddressUnix = 2, kAddressVsock = 3 };

struct ConnectParams {  // fmConnectParams_v2
  unsigned int version;
  char addressInfo[kMaxStrLength];  // "<ipv4>:<port>" or a socket path
  unsigned int timeoutMs;
  unsigned int addressIsUnixSocket;  // deprecated by addressType, still filled
  AddressType addressType;
};
inline constexpr unsigned int kConnectParamsVersion = ParamVersion<ConnectParams>(2);

struct PciDevice {  // fmPciDevice_t
  unsigned int domain, bus, device, function;
};

struct PartitionGpuInfo {  // fmFabricPartitionGpuInfo_t
  unsigned int physicalId;  // the GPU's module id, not its PCI order
  char uuid[kUuidBufferSize];
  char pciBusId[kPciBusIdBufferSize];  // "00000000:18:00.0"
  unsigned int numNvLinksAvailable;
  unsigned int maxNumNvLinks;
  unsigned int nvlinkLineRateMBps;
};

struct PartitionInfo {  // fmFabricPartitionInfo_t
  PartitionId partitionId;
  unsigned int isActive;
  unsigned int numGpus;
  PartitionGpuInfo gpuInfo[kMaxNumGpus];
};

struct PartitionList {  // fmFabricPartitionList_v2 (whose version number is 1)
  unsigned int version;
  unsigned int numPartitions;
  unsigned int maxNumPartitions;
  PartitionInfo partitionInfo[kMaxFabricPartitions];
};
inline constexpr unsigned int kPartitionListVersion = ParamVersion<PartitionList>(1);

struct ActivatedPartitionList {  // fmActivatedFabricPartitionList_v1
  unsigned int version;
  unsigned int numPartitions;
  PartitionId partitionIds[kMaxFabricPartitions];
};
inline constexpr unsigned int kActivatedPartitionListVersion = ParamVersion<ActivatedPartitionList>(1);

struct UnsupportedPartitionInfo {  // fmUnsupportedFabricPartitionInfo_t
  PartitionId partitionId;
  unsigned int numGpus;
  unsigned int gpuPhysicalIds[kMaxNumGpus];
};

struct UnsupportedPartitionList {  // fmUnsupportedFabricPartitionList_v1
  unsigned int version;
  unsigned int numPartitions;
  UnsupportedPartitionInfo partitionInfo[kMaxFabricPartitions];
};
inline constexpr unsigned int kUnsupportedPartitionListVersion = ParamVersion<UnsupportedPartitionList>(1);

// The SDK's sizes, as its headers define them on x86-64 and arm64.
static_assert(sizeof(ConnectParams) == 272);
static_assert(sizeof(PartitionGpuInfo) == 128);
static_assert(sizeof(PartitionInfo) == 2060);
static_assert(sizeof(PartitionList) == 131852);
static_assert(sizeof(ActivatedPartitionList) == 264);
static_assert(sizeof(UnsupportedPartitionList) == 4616);

// The library's entry points, by the names dlsym finds.
using LibInitFn = Return (*)();
using ConnectFn = Return (*)(ConnectParams*, Handle*);
using DisconnectFn = Return (*)(Handle);
using GetSupportedFn = Return (*)(Handle, PartitionList*);
using GetUnsupportedFn = Return (*)(Handle, UnsupportedPartitionList*);
using ActivateFn = Return (*)(Handle, PartitionId);
using DeactivateFn = Return (*)(Handle, PartitionId);
using SetActivatedFn = Return (*)(Handle, ActivatedPartitionList*);

}  // namespace vfio_agent::fabric::nvfm
