// The Cozystack dashboard (daemonset/cozystack/dashboards/gpu/vfio-gpu-agent.json) against `run`'s own /metrics: every
// series a panel's expression names is one the agent exports. The agent lists every family it declares, a family
// with no sample yet by its HELP and TYPE lines alone (metrics.cc, AllFamilies), so one scrape of a passthrough
// node holds the names of the families other modes fill (Fabric Manager, vGPU profiles, DRA Prepare).
#include <chrono>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "run_harness.h"

namespace vfio_agent::daemon::testing {
namespace {

using plugin::testing::Node;

// name -> type, from the scrape's TYPE lines.
std::map<std::string, std::string> Families(const std::string& scrape) {
  std::map<std::string, std::string> families;
  for (absl::string_view line : absl::StrSplit(scrape, '\n')) {
    std::vector<std::string> parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (parts.size() == 4 && parts[0] == "#" && parts[1] == "TYPE") families[parts[2]] = parts[3];
  }
  return families;
}

// The series an expression names: identifiers left once string literals, label matchers, ranges and the label
// lists of by/without/on/ignoring are gone, that are neither functions (followed by "(") nor PromQL keywords.
std::set<std::string> SeriesNamed(std::string expr) {
  expr = std::regex_replace(expr, std::regex(R"("(?:[^"\\]|\\.)*")"), "\"\"");
  expr = std::regex_replace(expr, std::regex(R"(\{[^}]*\})"), " ");
  expr = std::regex_replace(expr, std::regex(R"(\[[^\]]*\])"), " ");
  expr = std::regex_replace(expr, std::regex(R"(\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\))"), " ");
  static const std::set<std::string> kKeywords = {"and", "or", "unless", "bool", "offset", "inf", "nan"};
  std::set<std::string> names;
  const std::regex ident(R"([A-Za-z_:][A-Za-z0-9_:]*)");
  for (auto it = std::sregex_iterator(expr.begin(), expr.end(), ident); it != std::sregex_iterator(); ++it) {
    const std::string name = it->str();
    const size_t end = static_cast<size_t>(it->position() + it->length());
    const size_t next = expr.find_first_not_of(" \t\n", end);
    if (next != std::string::npos && expr[next] == '(') continue;  // a function or an aggregation
    if (kKeywords.contains(name)) continue;
    if (it->position() > 0 && std::isdigit(static_cast<unsigned char>(expr[it->position() - 1]))) continue;  // 5m, 1e-3
    names.insert(name);
  }
  return names;
}

// "" when `series` is a family of the scrape (a histogram's _bucket, _sum and _count included), else why not.
std::string Unknown(const std::string& series, const std::map<std::string, std::string>& families) {
  if (families.contains(series)) return "";
  for (const char* suffix : {"_bucket", "_sum", "_count"}) {
    const std::string s = suffix;
    if (series.size() > s.size() && series.ends_with(s)) {
      auto it = families.find(series.substr(0, series.size() - s.size()));
      if (it != families.end() && it->second == "histogram") return "";
    }
  }
  return series + " is not a series the agent exports";
}

void CollectExprs(const nlohmann::json& panels, std::vector<std::pair<std::string, std::string>>& out) {
  for (const nlohmann::json& panel : panels) {
    for (const nlohmann::json& target : panel.value("targets", nlohmann::json::array())) {
      out.emplace_back(panel.value("title", ""), target.value("expr", ""));
    }
    CollectExprs(panel.value("panels", nlohmann::json::array()), out);
  }
}

nlohmann::json Dashboard() {
  std::ifstream in(VA_DASHBOARD_JSON);
  if (!in) throw std::runtime_error("cannot read " VA_DASHBOARD_JSON);
  return nlohmann::json::parse(in);
}

TEST(DashboardSeriesTest, TheParserFindsSeriesAndNotFunctionsLabelsOrRanges) {
  EXPECT_THAT(SeriesNamed("histogram_quantile(0.99, sum by (le) (rate(a_seconds_bucket{x=\"y}\"}[5m])))"),
              ::testing::ElementsAre("a_seconds_bucket"));
  EXPECT_THAT(SeriesNamed("sum(b{state=\"healthy\"}) or vector(0)"), ::testing::ElementsAre("b"));
  EXPECT_THAT(SeriesNamed("max by (pod, check) (c) > 0 unless on (pod) d"), ::testing::ElementsAre("c", "d"));
  const std::map<std::string, std::string> families = {{"h", "histogram"}, {"g", "gauge"}};
  EXPECT_EQ(Unknown("h_bucket", families), "");
  EXPECT_EQ(Unknown("g", families), "");
  EXPECT_NE(Unknown("g_count", families), "");  // only a histogram has _count here
  EXPECT_NE(Unknown("vfio_gpu_agent_nope", families), "");
}

TEST(DashboardSeriesTest, EveryExpressionOfTheCozystackDashboardNamesASeriesTheAgentExports) {
  auto node = Node::Create("hgx-h200-8gpu.json");
  ASSERT_TRUE(node.ok()) << node.status();
  ASSERT_TRUE((*node)->StartKubelet({.pod_resources_socket = PodResourcesSocket(**node)}).ok());
  auto run = RunProcess::Start(**node);
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_TRUE((*run)->WaitReady()) << (*run)->Log();
  const std::string scrape = (*run)->Metrics();
  const std::map<std::string, std::string> families = Families(scrape);

  // Families of modes this node is not in are listed all the same, without a sample.
  EXPECT_EQ(families.count("vfio_gpu_agent_dra_prepare_duration_seconds"), 1u) << scrape;
  EXPECT_EQ(families.count("vfio_gpu_agent_vgpu_config_state"), 1u) << scrape;
  EXPECT_THAT(scrape, ::testing::Not(::testing::HasSubstr("vfio_gpu_agent_dra_prepare_duration_seconds_count")));
  // The start time is this process's: a restart is a new value.
  double started = 0;
  for (absl::string_view line : absl::StrSplit(scrape, '\n')) {
    if (absl::ConsumePrefix(&line, "vfio_gpu_agent_start_time_seconds ")) {
      ASSERT_TRUE(absl::SimpleAtod(line, &started));
    }
  }
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  EXPECT_GT(started, now - 300) << scrape;
  EXPECT_LE(started, now) << scrape;

  const nlohmann::json dashboard = Dashboard();
  std::vector<std::pair<std::string, std::string>> exprs;
  CollectExprs(dashboard.at("panels"), exprs);
  ASSERT_GE(exprs.size(), 10u);
  std::set<std::string> used;
  for (const auto& [title, expr] : exprs) {
    const std::set<std::string> series = SeriesNamed(expr);
    EXPECT_FALSE(series.empty()) << title << ": " << expr << " names no series";
    for (const std::string& name : series) {
      EXPECT_EQ(Unknown(name, families), "") << title << ": " << expr;
      used.insert(name);
    }
  }
  // What the issue asks the view to show.
  for (const char* wanted : {"vfio_gpu_agent_devices", "vfio_gpu_agent_not_ready", "vfio_gpu_agent_fabric",
                             "vfio_gpu_agent_vgpu_config_state", "vfio_gpu_agent_allocate_duration_seconds_bucket",
                             "vfio_gpu_agent_dra_prepare_duration_seconds_bucket",
                             "vfio_gpu_agent_start_time_seconds"}) {
    EXPECT_TRUE(used.contains(wanted)) << wanted;
  }

  // Cozystack's hack/check-gpu-recording-rules.bats takes any a:b:c token of a listed GPU dashboard for a
  // recording rule that must exist.
  std::ifstream in(VA_DASHBOARD_JSON);
  std::stringstream text;
  text << in.rdbuf();
  const std::string json = text.str();
  std::smatch rule;
  EXPECT_FALSE(std::regex_search(json, rule, std::regex("[a-z][a-z0-9_]*:[a-z0-9_]+:[a-z0-9_]+"))) << rule.str();
}

}  // namespace
}  // namespace vfio_agent::daemon::testing
