// Why a function is not on its vfio driver after a bind: a typed kind for metrics and events, beside the
// reason text that is written for people.
#pragma once

namespace vfio_agent::binding {

enum class Failure {
  kNone,
  kWriteDeadline,   // a sysfs write did not return within its deadline (abandoned in the kernel)
  kNoIommuGroup,    // no IOMMU group: vfio cannot take it
  kIommuGroup,      // its group is not viable, or a member of its group failed first
  kDevnodeMissing,  // on vfio, but /dev/vfio/<group> (or its iommufd cdevs) did not appear
  kDeviceRemoved,   // gone from sysfs during the bind
  kUnbindFailed,    // the host driver refused to let go
  kDriver,          // the vfio driver is not available (module not loadable)
  kUnreadable,      // the device's sysfs entry could not be read
  kBindFailed,      // the vfio driver did not take it
};

// Metric label: "write_deadline", "no_iommu_group", ... ("" for kNone).
const char* FailureName(Failure failure);

}  // namespace vfio_agent::binding
