// Every query of the Grafana dashboard operators import (deploy/grafana-dashboard.json, issue 52)
// evaluated by a real Prometheus (Debian's) scraping a real deployment (bench/soak_deployment.h:
// etcd, a coordinator, a producer on a shaped link, two replicas of `fables` with the pair's
// artifact) that has served the modes the panels split by (local, raw, scd), refused a call, and
// met the faults the panels count: a replica killed mid-decode (its stream moved and its greedy
// ids checked on the other replica) and the producer killed mid-transfer (the request fell back
// to the consumer's own prefill). Each panel query, its variables expanded as Grafana would for
// "All" (no `or vector(0)` fallback allowed), must return a series carrying every label its
// legend shows; the variables' own queries must list values; and the fault panels must count the
// faults. What this cannot see: Grafana itself (not packaged here) -- the panels' layout, units
// and rendering; a transfer taken over by a second producer (one producer here: its series is
// there, at 0).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "base/child_process.h"
#include "bench/kill_bench.h"
#include "bench/soak_deployment.h"
#include "bench/soak_workload.h"
#include "proto/inference_client.h"
#include "proto/wire_mode.h"
#include "tests/test_daemon.h"
#include "tests/test_files.h"

namespace scd {
namespace {

using bench::SoakDeployment;
using bench::SoakRole;
using nlohmann::json;

constexpr char kModel[] = "fables";
// The producer's links shaped to 1 Mbit/s: a 450-token prompt's raw codes take seconds on the
// link (time to kill the producer mid-transfer), a short prompt's a fraction of one.
constexpr char kLinkGbps[] = "0.001";

// The instant query's result (an array of samples); nullopt when the query failed.
std::optional<json> Query(httplib::Client& prometheus, const std::string& promql) {
  auto result = prometheus.Get("/api/v1/query", {{"query", promql}}, httplib::Headers());
  if (!result || result->status != 200) return std::nullopt;
  const json body = json::parse(result->body, nullptr, false);
  if (!body.is_object() || body.value("status", "") != "success") return std::nullopt;
  return body["data"]["result"];
}

// Polls `done` until it holds or `limit` passed: whether it held.
bool WaitUntil(const std::function<bool()>& done, absl::Duration limit) {
  const absl::Time give_up = absl::Now() + limit;
  while (!done()) {
    if (absl::Now() > give_up) return false;
    // waits: another process (Prometheus scraping, a daemon's Stats) that only polling can see
    absl::SleepFor(absl::Milliseconds(50));
  }
  return true;
}

double SumOf(const json& samples) {
  double sum = 0;
  for (const json& s : samples) sum += std::stod(s["value"][1].get<std::string>());
  return sum;
}

// A panel query as Grafana sends it with every variable at "All" and a 5-minute rate window.
std::string Expand(const std::string& expr) {
  return absl::StrReplaceAll(expr, {{"$__rate_interval", "5m"}, {"$model", ".*"}, {"$mode", ".*"}});
}

// The labels a legend shows ({{label}}).
std::vector<std::string> LegendLabels(const std::string& legend) {
  std::vector<std::string> labels;
  static const std::regex kLabel(R"(\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\})");
  for (auto it = std::sregex_iterator(legend.begin(), legend.end(), kLabel);
       it != std::sregex_iterator(); ++it) {
    labels.push_back((*it)[1]);
  }
  return labels;
}

// label_values(SELECTOR, LABEL) as a query that returns one series per value.
std::string LabelValuesQuery(const std::string& variable_query) {
  static const std::regex kLabelValues(R"(label_values\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\))");
  std::smatch m;
  if (!std::regex_match(variable_query, m, kLabelValues)) return "";
  return absl::StrCat("count by (", m[2].str(), ") (", m[1].str(), ")");
}

class DashboardQueriesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string artifact = dir_.File("fables.scd");
    const testing::CommandResult fit = testing::RunCommand(
        testing::Bin("scd-calib") + " fit --producer " + testing::ModelDir("stories260k") +
        " --consumer " + testing::ModelDir("stories260k-fables") +
        // A small fit (seconds): the panels need an artifact and its measured KL, not a good one.
        " --prefixes 40 --tokens 64 --aligner-epochs 5 --heldout-windows 8 --quiet --out " +
        artifact);
    ASSERT_EQ(fit.exit_code, 0) << fit.err;
    bench::SoakDeploymentSpec spec;
    spec.bin_dir = testing::BuildDir() + "/bin";
    spec.dir = dir_.File("nodes");
    std::filesystem::create_directories(spec.dir);
    spec.producer_model = testing::ModelDir("stories260k");
    spec.consumers = {{kModel, testing::ModelDir("stories260k-fables"), artifact},
                      {kModel, testing::ModelDir("stories260k-fables"), artifact}};
    spec.coordinators = 1;
    spec.http = true;
    spec.producer_flags = {"--link-gbps", kLinkGbps};
    absl::StatusOr<std::unique_ptr<SoakDeployment>> started = SoakDeployment::Start(spec);
    ASSERT_TRUE(started.ok()) << started.status();
    deployment_ = *std::move(started);
    for (int i = 0; i < deployment_->size(); ++i) {
      const bench::SoakNode node = deployment_->Node(i);
      if (node.role == SoakRole::kCoordinator) coordinator_ = node.address;
      if (node.role == SoakRole::kProducer) producer_ = i;
      if (node.role == SoakRole::kConsumer) replicas_.push_back(i);
    }
    StartPrometheus();
  }

  void TearDown() override {
    if (prometheus_) prometheus_->Terminate(absl::Seconds(10));
  }

  // Prometheus finds the nodes through a file (file_sd): rewritten after a restart, so the new
  // incarnation of a node is scraped as deployments' service discovery would find it.
  void WriteTargets() {
    json groups = json::array();
    for (const bench::SoakNode& node : deployment_->Snapshot()) {
      if (node.role == SoakRole::kEtcd || !node.up || node.http_address.empty()) continue;
      groups.push_back({{"targets", {node.http_address}},
                        {"labels", {{"job", bench::SoakRoleName(node.role)}}}});
    }
    testing::WriteFile(dir_.File("targets.json.tmp"), groups.dump());
    std::filesystem::rename(dir_.File("targets.json.tmp"), dir_.File("targets.json"));
  }

  void StartPrometheus() {
    WriteTargets();
    const int port = testing::FreeLoopbackPort();
    testing::WriteFile(dir_.File("prometheus.yml"),
                       absl::StrCat("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
                                    "scrape_configs:\n  - job_name: scd\n    file_sd_configs:\n"
                                    "      - files: ['",
                                    dir_.File("targets.json"), "']\n"));
    absl::StatusOr<ChildProcess> prometheus =
        ChildProcess::Start({"prometheus", "--config.file=" + dir_.File("prometheus.yml"),
                             "--storage.tsdb.path=" + dir_.File("tsdb"),
                             "--web.listen-address=127.0.0.1:" + std::to_string(port)},
                            dir_.File("prometheus.log"));
    ASSERT_TRUE(prometheus.ok()) << prometheus.status();
    prometheus_.emplace(*std::move(prometheus));
    client_ = std::make_unique<httplib::Client>("127.0.0.1", port);
    client_->set_connection_timeout(2);
  }

  // Waits until every node up is scraped (up == 1 for as many targets), at most a minute.
  void AwaitScrapes() {
    int want = 0;
    for (const bench::SoakNode& node : deployment_->Snapshot()) {
      want += node.role != SoakRole::kEtcd && node.up;
    }
    const bool scraped = WaitUntil(
        [&] {
          const std::optional<json> up = Query(*client_, "sum(up == 1)");
          return up && !up->empty() && SumOf(*up) == want;
        },
        absl::Seconds(60));
    ASSERT_TRUE(scraped) << "Prometheus did not scrape " << want << " nodes; "
                         << testing::ReadFile(dir_.File("prometheus.log"));
  }

  // The sum of `promql`'s samples (-1: the query failed or returned nothing).
  double Total(const std::string& promql) {
    const std::optional<json> samples = Query(*client_, promql);
    return samples && !samples->empty() ? SumOf(*samples) : -1;
  }

  void ServeEachMode();
  void MoveAStream();
  void FallBackATransfer();

  testing::TempDir dir_;
  std::unique_ptr<SoakDeployment> deployment_;
  std::string coordinator_;
  int producer_ = -1;
  std::vector<int> replicas_;
  std::optional<ChildProcess> prometheus_;
  std::unique_ptr<httplib::Client> client_;
};

// Three greedy requests in each mode, and a call refused (an unknown target).
void DashboardQueriesTest::ServeEachMode() {
  for (const char* mode : {"local", "raw", "scd"}) {
    for (int i = 0; i < 3; ++i) {
      v1::GenerateRequest request;
      request.set_prompt(absl::StrCat("Once upon a time, there were ", i + 2, " cats"));
      request.add_targets(kModel);
      SetRequestModeName(mode, &request);
      request.set_max_tokens(12);
      std::string ran;
      ASSERT_TRUE(
          StreamGenerate(coordinator_, request, absl::Seconds(60), [&](const v1::GenerateEvent& e) {
            if (e.has_finished()) ran = RanModeName(e.finished());
          }).ok());
      EXPECT_EQ(ran, mode);
    }
  }
  v1::GenerateRequest unknown;
  unknown.set_prompt("x");
  unknown.add_targets("nobody");
  EXPECT_EQ(StreamGenerate(coordinator_, unknown, absl::Seconds(30), [](const auto&) {}).code(),
            absl::StatusCode::kNotFound);
}

// A greedy local stream whose replica is killed at its first token moves to the other replica
// (bench/kill_bench.h; a round whose stream ended before a replica showed it is run again).
void DashboardQueriesTest::MoveAStream() {
  bench::KillBenchOptions options;
  options.max_tokens = 256;
  absl::StatusOr<std::vector<std::string>> prompts =
      bench::SoakPrompts(testing::SharedDir() + "/data/tinystories_train_prompts.txt", 4, 6);
  ASSERT_TRUE(prompts.ok()) << prompts.status();
  for (int round = 0; round < 40; round += 4) {  // rounds 0, 4, ...: local and greedy
    const bench::KillRound r =
        bench::RunKillRound(*deployment_, coordinator_, replicas_, options, *prompts, round);
    ASSERT_TRUE(r.error.empty()) << r.error;
    if (!r.killed) continue;
    ASSERT_EQ(r.moves, 1);
    ASSERT_TRUE(r.finished && r.equal);
    return;
  }
  FAIL() << "no stream was still decoding at its first token in 10 rounds";
}

// A raw request whose 450-token prompt's codes are on the shaped link when the producer is
// killed ends on the consumer's own prefill; the producer is restarted.
void DashboardQueriesTest::FallBackATransfer() {
  v1::GenerateRequest request;
  for (int i = 0; i < 450; ++i) request.add_prompt_ids(1 + (i * 37) % 500);
  request.add_targets(kModel);
  SetRequestModeName("raw", &request);
  request.set_max_tokens(8);
  request.set_allow_local_fallback(true);
  std::string ran, reason;
  absl::Status status;
  std::thread call([&] {
    status =
        StreamGenerate(coordinator_, request, absl::Seconds(120), [&](const v1::GenerateEvent& e) {
          if (!e.has_finished()) return;
          ran = RanModeName(e.finished());
          reason = e.finished().mode_reason();
        });
  });
  const bool transferring = WaitUntil(
      [&] {
        const absl::StatusOr<v1::NodeStats> stats = deployment_->Stats(producer_);
        return stats.ok() && stats->open_sessions() > 0 && stats->held_payload_bytes() > 0;
      },
      absl::Seconds(30));
  if (transferring) deployment_->Kill(producer_);
  call.join();
  ASSERT_TRUE(transferring) << "the transfer never began";
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(ran, "local");
  EXPECT_THAT(reason, ::testing::HasSubstr("fallback"));
  ASSERT_TRUE(deployment_->Restart(producer_).ok());
}

TEST_F(DashboardQueriesTest, EveryPanelQueryReturnsSeriesWithTheLabelsItsLegendShows) {
  ASSERT_NO_FATAL_FAILURE(AwaitScrapes());
  ASSERT_NO_FATAL_FAILURE(ServeEachMode());
  // Every series the requests made scraped twice before a fault can take its node down: a
  // family made on first use (per mode) on a replica killed next would otherwise have one
  // sample, too few for a rate.
  ASSERT_TRUE(WaitUntil(
      [&] {
        for (const char* family :
             {"scd:compression_ratio_count", "scd:time_to_first_token_seconds_count",
              "scd:e2e_request_latency_seconds_count", "scd:transfer_bytes_total",
              "scd:requests_total"}) {
          if (Total(absl::StrCat("min(count_over_time(", family, "[5m]))")) < 2) return false;
        }
        return true;
      },
      absl::Seconds(30)));
  ASSERT_NO_FATAL_FAILURE(MoveAStream());
  ASSERT_NO_FATAL_FAILURE(FallBackATransfer());
  WriteTargets();  // the restarted replica's and producer's new ports
  ASSERT_NO_FATAL_FAILURE(AwaitScrapes());
  // Scraped since the faults: the coordinator's counts of them are in.
  ASSERT_TRUE(WaitUntil(
      [&] {
        return Total("sum(scd:stream_moves_total{role=\"coordinator\"})") >= 1 &&
               Total("sum(scd:transfer_fallbacks_total{role=\"coordinator\"})") >= 1;
      },
      absl::Seconds(30)))
      << "the faults never reached Prometheus";

  std::ifstream file(std::string(SCD_SOURCE_DIR) + "/deploy/grafana-dashboard.json");
  const json dashboard = json::parse(file, nullptr, false);
  ASSERT_TRUE(dashboard.is_object()) << "the dashboard is not JSON";
  for (const json& variable : dashboard["templating"]["list"]) {
    if (variable.value("type", "") != "query") continue;
    const std::string query = LabelValuesQuery(variable["query"].get<std::string>());
    ASSERT_FALSE(query.empty()) << variable.dump();
    const std::optional<json> values = Query(*client_, query);
    ASSERT_TRUE(values.has_value()) << query;
    EXPECT_FALSE(values->empty()) << "variable " << variable["name"] << " lists nothing";
  }
  int targets = 0;
  for (const json& panel : dashboard["panels"]) {
    const std::string title = panel["title"].get<std::string>();
    for (const json& target : panel["targets"]) {
      ++targets;
      const std::string expr = Expand(target["expr"].get<std::string>());
      EXPECT_EQ(expr.find("vector("), std::string::npos) << title << ": " << expr;
      EXPECT_EQ(expr.find('$'), std::string::npos) << title << ": a variable left: " << expr;
      const std::optional<json> samples = Query(*client_, expr);
      ASSERT_TRUE(samples.has_value()) << title << ": the query failed: " << expr;
      EXPECT_FALSE(samples->empty()) << title << ": no series for " << expr;
      for (const json& sample : *samples) {
        for (const std::string& label : LegendLabels(target.value("legendFormat", ""))) {
          EXPECT_TRUE(sample["metric"].contains(label))
              << title << ": a series without `" << label << "`: " << sample.dump();
        }
      }
    }
  }
  EXPECT_GE(targets, 25);
  // The faults' panels count them.
  EXPECT_EQ(Total("sum(scd:stream_moves_total{role=\"coordinator\"})"), 1);
  EXPECT_EQ(Total("sum(scd:transfer_fallbacks_total{role=\"coordinator\",mode=\"raw\"})"), 1);
  EXPECT_GT(Total("sum(scd:continued_tokens_checked_total{role=\"coordinator\"})"), 0);
  EXPECT_GE(Total("sum(scd:request_failures_total{role=\"coordinator\",reason=\"refused\"})"), 1);
}

}  // namespace
}  // namespace scd
