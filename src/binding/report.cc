// Text and JSON forms of a bind/unbind report.
#include <google/protobuf/util/json_util.h>

#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "report/v1/bind.pb.h"
#include "vfio_gpu_agent/binding/binder.h"

namespace vfio_agent::binding {
namespace {

namespace pb = ::vfio_agent::report::v1;

pb::Role ToProto(pci::Role role) {
  switch (role) {
    case pci::Role::kGpu:
      return pb::GPU;
    case pci::Role::kCompanion:
      return pb::COMPANION;
    case pci::Role::kNvSwitch:
      return pb::NVSWITCH;
    case pci::Role::kBridge:
      return pb::BRIDGE;
    case pci::Role::kForeign:
      return pb::FOREIGN;
  }
  return pb::ROLE_UNSPECIFIED;
}

pb::Outcome ToProto(Outcome outcome) {
  switch (outcome) {
    case Outcome::kBound:
      return pb::OUTCOME_BOUND;
    case Outcome::kAlreadyBound:
      return pb::OUTCOME_ALREADY_BOUND;
    case Outcome::kWouldBind:
      return pb::OUTCOME_WOULD_BIND;
    case Outcome::kBlocked:
      return pb::OUTCOME_BLOCKED;
    case Outcome::kFailed:
      return pb::OUTCOME_FAILED;
    case Outcome::kRestored:
      return pb::OUTCOME_RESTORED;
    case Outcome::kNotBound:
      return pb::OUTCOME_NOT_BOUND;
    case Outcome::kRefused:
      return pb::OUTCOME_REFUSED;
  }
  return pb::OUTCOME_UNSPECIFIED;
}

std::string DriverText(const std::string& driver) { return driver.empty() ? "(no driver)" : driver; }

std::string Summary(const BindReport& report) {
  std::map<Outcome, int> counts;
  for (const DeviceResult& device : report.devices) ++counts[device.outcome];
  std::vector<std::string> parts;
  for (const auto& [outcome, count] : counts) parts.push_back(absl::StrCat(count, " ", OutcomeName(outcome)));
  return absl::StrCat(report.operation, report.dry_run ? " (dry run)" : "", ": ", report.devices.size(),
                      " device(s)", parts.empty() ? "" : ": ", absl::StrJoin(parts, ", "), " - ",
                      report.ok() ? "OK" : "NOT OK");
}

std::string DeviceLine(const DeviceResult& device) {
  std::string line = absl::StrCat(device.bdf, " ", device.vendor_device, " ", pci::RoleName(device.role), " group ",
                                  device.iommu_group ? std::to_string(*device.iommu_group) : "none", ": ",
                                  OutcomeName(device.outcome));
  switch (device.outcome) {
    case Outcome::kBound:
    case Outcome::kRestored:
      absl::StrAppend(&line, " ", DriverText(device.driver_before), " -> ", DriverText(device.driver_after));
      break;
    case Outcome::kWouldBind:
      absl::StrAppend(&line, " ", DriverText(device.driver_before), " -> ", device.target_driver);
      break;
    case Outcome::kAlreadyBound:
      absl::StrAppend(&line, " (", DriverText(device.driver_after), ")");
      break;
    case Outcome::kBlocked:
    case Outcome::kFailed:
    case Outcome::kNotBound:
    case Outcome::kRefused:
      absl::StrAppend(&line, " (on ", DriverText(device.driver_after), ")");
      break;
  }
  if (!device.reason.empty()) absl::StrAppend(&line, ": ", device.reason);
  if (device.elapsed > absl::ZeroDuration()) {
    absl::StrAppend(&line, absl::StrFormat(" [%.2fs]", absl::ToDoubleSeconds(device.elapsed)));
  }
  return line;
}

}  // namespace

std::string FormatBindReport(const BindReport& report) {
  std::string out;
  for (const std::string& note : report.notes) absl::StrAppend(&out, "note: ", note, "\n");
  for (const DeviceResult& device : report.devices) absl::StrAppend(&out, DeviceLine(device), "\n");
  absl::StrAppend(&out, Summary(report), "\n");
  return out;
}

std::string BindReportToJson(const BindReport& report) {
  pb::BindReport message;
  message.set_schema("vfio-gpu-agent.bind/v1");
  message.set_operation(report.operation);
  message.set_dry_run(report.dry_run);
  message.set_ok(report.ok());
  for (const std::string& note : report.notes) message.add_notes(note);
  for (const DeviceResult& device : report.devices) {
    pb::DeviceResult* out = message.add_devices();
    out->set_bdf(device.bdf);
    out->set_vendor_device(device.vendor_device);
    out->set_role(ToProto(device.role));
    out->set_iommu_group(device.iommu_group.value_or(-1));
    out->set_driver_before(device.driver_before);
    out->set_target_driver(device.target_driver);
    out->set_driver_after(device.driver_after);
    out->set_outcome(ToProto(device.outcome));
    out->set_reason(device.reason);
    for (const std::string& step : device.steps) out->add_steps(step);
    for (const Holder& holder : device.holders) {
      pb::Holder* h = out->add_holders();
      h->set_pid(holder.pid);
      h->set_comm(holder.comm);
      h->set_what(holder.what);
    }
    out->set_seconds(absl::ToDoubleSeconds(device.elapsed));
  }
  message.set_summary(Summary(report));
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  std::string json;
  // Printing a message we just built cannot fail.
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  return json;
}

}  // namespace vfio_agent::binding
