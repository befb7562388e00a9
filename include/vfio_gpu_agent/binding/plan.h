// The binding plan: per IOMMU group, what `bind` will do to each member and why a group is blocked.
// `bind --dry-run` prints it and `inspect` shows it; the binder executes it. Planning is pure (no I/O):
// the host state it needs (modules.alias, loaded drivers) is read once into a TargetDriverChooser.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "vfio_gpu_agent/binding/failure.h"
#include "vfio_gpu_agent/common/host_paths.h"
#include "vfio_gpu_agent/pci/inventory.h"
#include "vfio_gpu_agent/pci/selection.h"

namespace vfio_agent::binding {

inline constexpr std::string_view kVfioPci = "vfio-pci";

// Kernel modalias of a function, as <dev>/modalias shows it:
// "pci:v000010DEd00002342sv000010DEsd000016EBbc03sc02i00".
std::string Modalias(const pci::Function& fn);

// Driver names compare equal when they differ only in '-' versus '_' (module "vfio_pci" is driver "vfio-pci").
bool SameDriver(std::string_view a, std::string_view b);

// The `alias vfio_pci:<pattern> <module>` lines of a kernel's modules.alias: vfio variant drivers
// (e.g. nvgrace_gpu_vfio_pci) and the device patterns they claim.
class VariantTable {
 public:
  static VariantTable Parse(std::string_view modules_alias);
  // <modules_root>/<kernel_release>/modules.alias; NotFound when the file is absent (e.g. an immutable
  // host that does not expose /lib/modules), which callers treat as "no variants".
  static absl::StatusOr<VariantTable> Load(const std::filesystem::path& modules_root,
                                           std::string_view kernel_release);

  // libvirt's rule: among the patterns matching the modalias, the one with the fewest '*' wins
  // (first in file order on a tie). nullopt when no variant matches.
  std::optional<std::string> BestVariant(std::string_view modalias) const;
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    std::string pattern;  // the modalias glob with the leading "vfio_" stripped: "pci:v000010DEd..."
    std::string module;
    int wildcards = 0;
  };
  std::vector<Entry> entries_;
};

// Decides the target driver of each function: the best vfio variant, else vfio-pci. Knows which PCI
// drivers are registered, so a plan can say when a module still has to be loaded.
class TargetDriverChooser {
 public:
  struct Choice {
    std::string driver;   // driver directory name when registered ("vfio-pci"), else the module name
    std::string module;   // module providing it ("vfio_pci", "nvgrace_gpu_vfio_pci")
    bool registered = false;  // <sysfs>/bus/pci/drivers/<driver> exists now
  };

  TargetDriverChooser(VariantTable variants, std::vector<std::string> registered_drivers);
  // Reads modules.alias for `kernel_release` ("" = running kernel, uname -r) and lists the registered
  // drivers. A missing modules.alias is not an error (vfio-pci for everything); notes() says so.
  static absl::StatusOr<TargetDriverChooser> FromHost(const HostPaths& paths, std::string kernel_release = "");

  Choice Choose(const pci::Function& fn) const;
  const std::vector<std::string>& notes() const { return notes_; }

 private:
  VariantTable variants_;
  std::vector<std::string> registered_;
  std::vector<std::string> notes_;
};

// uname -r of the running kernel.
std::string RunningKernelRelease();

enum class Action {
  kAlreadyBound,  // on a vfio driver; no writes at all
  kBind,          // will move to target_driver
  kBlocked,       // cannot be passed through; see reason
  kStays,         // bridges, and foreign endpoints that do not block (unbound / pci-stub / vfio)
};
const char* ActionName(Action action);  // "already-bound", "bind", "blocked", "stays"

struct PlannedFunction {
  std::string bdf;
  std::string vendor_device;  // "10de:2335"
  pci::Role role = pci::Role::kForeign;
  std::string current_driver;     // "" when unbound
  std::string target_driver;      // "" for kStays
  std::string target_module;      // module providing target_driver ("" for kStays)
  bool target_registered = false; // false: the module must be loaded before binding
  Action action = Action::kBlocked;
  std::string reason;             // why blocked, or a note ("on vfio-pci; best variant is ...")
  Failure blocked_by = Failure::kNone;  // with kBlocked
};

struct PlannedGroup {
  std::optional<int> id;                  // nullopt: a selected function without an IOMMU group
  std::vector<PlannedFunction> functions; // every member of the group, BDF order
  bool blocked = false;
  std::string reason;                     // why the group is blocked
  bool NeedsWrites() const;               // any member with Action::kBind
};

struct Plan {
  // Groups by id; functions without an IOMMU group follow as blocked groups without id.
  std::vector<PlannedGroup> groups;
  const PlannedFunction* Find(std::string_view bdf) const;
};

// Pure: decides from the inventory, selection and the chooser. A group is blocked as a whole when a
// foreign endpoint in it is bound to a non-viable driver; a function without an IOMMU group is blocked
// because vfio-pci cannot take it and unbinding would leave it without any driver.
Plan MakePlan(const pci::Inventory& inventory, const pci::Selection& selection, const TargetDriverChooser& chooser);

// Keeps the groups holding any of `bdfs` (whole groups: binding one member binds its group); empty `bdfs` keeps
// nothing. InvalidArgument naming a BDF that is not in the plan.
absl::StatusOr<Plan> RestrictPlan(const Plan& plan, const std::vector<std::string>& bdfs);

// Human-readable plan, one line per group and one per member (what `bind --dry-run` prints).
std::string FormatPlan(const Plan& plan);

}  // namespace vfio_agent::binding
