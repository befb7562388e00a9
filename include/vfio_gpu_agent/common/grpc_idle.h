// gRPC settings that keep an idle agent asleep (tests/bench/README.md, "Idle CPU: where it goes").
#pragma once

namespace vfio_agent {

// A sync server's pollers wake at this timeout when no call comes (gRPC's default is 10 s); Shutdown wakes them
// at once, so a day costs nothing. Give it to ServerBuilder::SetSyncServerOption(CQ_TIMEOUT_MSEC, ...).
inline constexpr int kSyncPollerTimeoutMs = 24 * 3600 * 1000;

}  // namespace vfio_agent
