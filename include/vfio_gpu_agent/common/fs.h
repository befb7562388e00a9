// Small, error-as-value wrappers over the sysfs/devfs file operations the agent needs.
// Every error message names the path and the errno text.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace vfio_agent::fs {

// Every read below takes only regular files (sysfs and procfs attributes are regular files) and at most
// `max_bytes`: a FIFO, a device node such as /dev/zero or a directory is an InvalidArgument error naming the
// path and its type, never a hang or an unbounded allocation; a larger file is an OutOfRange error.
inline constexpr size_t kMaxAttributeBytes = 64 * 1024;  // sysfs attributes are at most a page
inline constexpr size_t kMaxFileBytes = 16 * 1024 * 1024;  // pci.ids (~1.4 MB), modules.alias (~1.5 MB)

// Whole file content; trailing whitespace stripped.
absl::StatusOr<std::string> ReadTrimmed(const std::filesystem::path& path, size_t max_bytes = kMaxFileBytes);

// Parses "0x10de\n"-style sysfs hex attributes.
absl::StatusOr<uint32_t> ReadHex(const std::filesystem::path& path);

// Parses a decimal attribute such as numa_node ("-1\n").
absl::StatusOr<int64_t> ReadInt(const std::filesystem::path& path);

// Basename of a symlink's target ("../../../bus/pci/drivers/vfio-pci" -> "vfio-pci");
// NotFound when the link does not exist.
absl::StatusOr<std::string> ReadLinkBasename(const std::filesystem::path& path);

// Writes `data` with a single write(2), as sysfs expects; the kernel's errno becomes the status.
absl::Status WriteAttribute(const std::filesystem::path& path, std::string_view data);

// Names of the entries of a directory, sorted; NotFound when it does not exist. A directory that goes away
// while it is listed (/proc/<pid>/fd of an exiting process, a removed device) is an error status, never an
// exception.
absl::StatusOr<std::vector<std::string>> ListDir(const std::filesystem::path& dir);

bool Exists(const std::filesystem::path& path);

// How long a file written by WriteFileAtomically must last.
enum class Durability {
  kAcrossReboots,  // fsync before the rename: a power loss leaves the old file or the new one
  // Meant for this boot only (a claim's CDI spec, metadata and checkpoint: a checkpoint of another boot is
  // discarded, and /var/run is a tmpfs): no fsync, which costs a disk flush per file. A reader still sees the
  // old file or the new one; after a power loss the file may be empty, which its reader must take as absent.
  kThisBoot,
};

// Replaces `path` with `content` (mode `mode`) so that a reader sees the old file or the new one, never a partial
// one: a private temporary file in the same directory, written (and fsynced for kAcrossReboots), then rename(2).
// The directory must exist.
absl::Status WriteFileAtomically(const std::filesystem::path& path, std::string_view content, unsigned mode = 0644,
                                 Durability durability = Durability::kAcrossReboots);

// Maps an errno to the closest absl status code, with "<what> <path>: <strerror>" as the message.
absl::Status ErrnoStatus(int err, std::string_view what, const std::filesystem::path& path);

}  // namespace vfio_agent::fs
