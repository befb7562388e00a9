// gRPC settings that keep an idle agent asleep (tests/bench/README.md, "Idle CPU: where it goes").
#pragma once

namespace vfio_agent {

// A sync server's pollers wake at this timeout when no call comes (gRPC's default is 10 s); Shutdown wakes them
// at once, so a day costs nothing. Give it to ServerBuilder::SetSyncServerOption(CQ_TIMEOUT_MSEC, ...).
inline constexpr int kSyncPollerTimeoutMs = 24 * 3600 * 1000;

// gRPC 1.51 creates its default EventEngine with every server, and that engine's timer thread wakes once a second
// even with no timer set (its timer list looks at most 1 s ahead). Nothing the agent serves asks the engine for
// anything, so this installs one that creates gRPC's own engine only on the first request made of it. Call before
// the first gRPC object is made.
void CreateGrpcEventEngineOnFirstUse();

}  // namespace vfio_agent
