// vGPU profile configs for the nodes sysfs-sim ships (vgpu-mdev-t4-a10.json: GPU 0 a T4, GPU 1 an A10;
// vgpu-sriov-l40s-h200.json: an L40S and two H200), shared by the applier's and `run`'s tests.
#pragma once

namespace vfio_agent::testing {

inline constexpr char kSimNodeProfileConfigs[] = R"(version: v1
vgpu-configs:
  t4-1q-2:
    - devices: [0]
      vgpu-devices: {T4-1Q: 2}
  t4-2q-2:
    - devices: [0]
      vgpu-devices: {T4-2Q: 2}
  t4-2q-10:
    - devices: [0]
      vgpu-devices: {T4-2Q: 10}
  t4-4q-4:
    - devices: [0]
      vgpu-devices: {T4-4Q: 4}
  t4-1q-32:
    - devices: [0]
      vgpu-devices: {T4-1Q: 32}
  t4-mixed:
    - devices: [0]
      vgpu-devices: {T4-1Q: 2, T4-2Q: 2}
  both-cards:
    - devices: [0]
      vgpu-devices: {T4-2Q: 8}
    - devices: [1]
      vgpu-devices: {A10-4Q: 6}
  h200-small-3:
    - devices: all
      device-filter: 0x233510DE
      vgpu-devices: {H200X-1-18C: 3}
  h200-small:
    - devices: all
      device-filter: 0x233510DE
      vgpu-devices: {H200X-1-18C: 7}
  h200-small-9:
    - devices: all
      device-filter: 0x233510DE
      vgpu-devices: {H200X-1-18C: 9}
  h200-whole:
    - devices: all
      device-filter: 0x233510DE
      vgpu-devices: {H200X-141C: 1}
)";

}  // namespace vfio_agent::testing
