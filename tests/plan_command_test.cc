// `scd-bench plan` (bench/plan_command.h) as a user runs it, checked against brute force: the
// committed example pair under a small workload, the plan's pick against every candidate of the
// same space (the default policies: local, scd, auto) run through the simulator -- none that meets
// is cheaper, and at its cost none has more than 5 % more goodput per node (the acceptance's bound)
// -- and the deployment it writes reads back and runs as predicted. And how a candidate is made of
// the template.
#include "bench/plan_command.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/child_process.h"
#include "tests/test_files.h"

namespace scd::bench {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string Example(const std::string& name) {
  return std::string(SCD_SOURCE_DIR) + "/bench/cluster/" + name;
}

TEST(PlanCommandTest, ACandidateIsTheTemplateWithItsCountsAndLink) {
  absl::StatusOr<SimDeployment> tmpl = ReadSimDeployment(Example("example_deployment.toml"));
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  absl::StatusOr<SimDeployment> scd =
      PlanDeployment(*tmpl, {RequestedMode(TransferMode::kScd), 3, 5}, 0.25, 50);
  ASSERT_TRUE(scd.ok()) << scd.status();
  EXPECT_EQ(scd->producers[0].count, 3);
  EXPECT_EQ(scd->consumers[0].count, 5);
  EXPECT_EQ(scd->LinkOf(0, 0).gbps, 0.25);
  EXPECT_EQ(scd->LinkOf(0, 0).latency_us, 50);
  // Local: no producer pool, so no node and no link is paid for.
  absl::StatusOr<SimDeployment> local =
      PlanDeployment(*tmpl, {RequestedMode(TransferMode::kLocal), 0, 2});
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_TRUE(local->producers.empty());
  EXPECT_TRUE(local->links.empty());
  EXPECT_TRUE(local->consumers[0].producer.empty());
  EXPECT_EQ(local->nodes(), tmpl->coordinators + 2);
  // The link as the template had it where none is asked.
  absl::StatusOr<SimDeployment> same = PlanDeployment(*tmpl, {RequestedMode::Auto(), 1, 1});
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->LinkOf(0, 0).gbps, tmpl->LinkOf(0, 0).gbps);
  // A template of two consumer pools is not one pair.
  SimDeployment two = *tmpl;
  two.consumers.push_back(two.consumers[0]);
  two.consumers[1].name = "other";
  EXPECT_THAT(PlanDeployment(two, {RequestedMode::Auto(), 1, 1}).status().message(),
              HasSubstr("one pair"));

  absl::StatusOr<SimWorkload> w = ReadSimWorkload(Example("example_workload.toml"));
  ASSERT_TRUE(w.ok());
  const SimWorkload all_scd = PlanWorkload(*w, RequestedMode(TransferMode::kScd));
  ASSERT_EQ(all_scd.mix.size(), w->mix.size());
  for (const SimMix& m : all_scd.mix) EXPECT_EQ(m.mode, RequestedMode(TransferMode::kScd));
  EXPECT_EQ(all_scd.rate, w->rate);
}

// Long prompts sharing prefixes at 30/s, TTFT 200 ms: one consumer cannot prefill them all
// locally, and a producer at half a CPU passes ~10 of them a second, so pools of both kinds and
// every policy come into play.
constexpr char kWorkload[] = R"([workload]
duration_s = 20
rate = 30
[prompt]
distribution = "lognormal"
mean = 200
sigma = 0.6
min = 16
max = 600
[output]
distribution = "uniform"
min = 8
max = 32
[prefix]
groups = 8
share = 0.5
tenants = 2
[[mix]]
target = "fables"
mode = "auto"
[slo]
ttft_ms = 200
tpot_ms = 15
)";

struct PlanRun {
  int status = -1;
  std::string output;
};

PlanRun Plan(const std::string& workload, const std::string& out, int max_producers = 4,
             int max_consumers = 8) {
  std::vector<std::string> argv = {testing::BuildDir() + "/bin/scd-bench",
                                   "plan",
                                   "--deployment",
                                   Example("example_deployment.toml"),
                                   "--workload",
                                   workload,
                                   "--out",
                                   out,
                                   "--seeds",
                                   "2",
                                   "--max-producers",
                                   std::to_string(max_producers),
                                   "--max-consumers",
                                   std::to_string(max_consumers)};
  absl::StatusOr<ChildProcess::Outcome> run = ChildProcess::Run(argv);
  EXPECT_TRUE(run.ok()) << run.status();
  return run.ok() ? PlanRun{run->status, run->output} : PlanRun{};
}

TEST(PlanCommandTest, PicksWhatABruteForceSearchOfTheSimulatorPicks) {
  const std::string dir = fs::temp_directory_path() / ("scd-plan-" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string workload = dir + "/workload.toml";
  testing::WriteFile(workload, kWorkload);
  const PlanRun run = Plan(workload, dir + "/a");
  ASSERT_EQ(run.status, 0) << run.output;
  const nlohmann::json j = nlohmann::json::parse(testing::ReadFile(dir + "/a/plan.json"));
  ASSERT_TRUE(j["plan"].is_object()) << j.dump(1);
  const double cost = j["plan"]["cost"].get<double>();
  const double per_node = j["plan"]["goodput_per_node"].get<double>();
  EXPECT_GT(j["runner_up"]["cost"].get<double>() + 1e-9, cost);

  // Every candidate of the same space, through the same simulator.
  absl::StatusOr<SimDeployment> tmpl = ReadSimDeployment(Example("example_deployment.toml"));
  absl::StatusOr<SimWorkload> w = ParseSimWorkload(kWorkload);
  ASSERT_TRUE(tmpl.ok() && w.ok());
  int runs = 0, meet = 0;
  double best_per_node_at_cost = 0;
  for (const RequestedMode policy : {RequestedMode(TransferMode::kLocal),
                                     RequestedMode(TransferMode::kScd), RequestedMode::Auto()}) {
    const bool local = policy.Is(TransferMode::kLocal);
    for (int64_t c = 1; c <= 8; ++c) {
      for (int64_t p = local ? 0 : 1; p <= (local ? 0 : 4); ++p) {
        absl::StatusOr<SimDeployment> d = PlanDeployment(*tmpl, {policy, p, c});
        ASSERT_TRUE(d.ok()) << d.status();
        absl::StatusOr<PlanOutcome> o = EvaluatePlan(*d, PlanWorkload(*w, policy), 2, 60);
        ASSERT_TRUE(o.ok()) << o.status();
        ++runs;
        if (o->attainment < 0.9) continue;
        ++meet;
        const double k = static_cast<double>(p + c);
        EXPECT_GE(k, cost) << RequestedModeName(policy) << " " << p << "+" << c
                           << " meets and is cheaper than the plan: " << j["plan"].dump();
        if (k == cost) best_per_node_at_cost = std::max(best_per_node_at_cost, o->goodput / k);
      }
    }
  }
  EXPECT_GT(meet, 0);
  EXPECT_GE(per_node, 0.95 * best_per_node_at_cost) << j["plan"].dump();
  // The search ran a fraction of what brute force did.
  EXPECT_LT(j["evaluated"].size() * 2, static_cast<size_t>(runs)) << j["evaluated"].size();

  // The deployment it wrote reads back from where it is and predicts what the plan said.
  absl::StatusOr<SimDeployment> planned = ReadSimDeployment(dir + "/a/deployment.toml");
  ASSERT_TRUE(planned.ok()) << planned.status();
  EXPECT_EQ(planned->consumers[0].count, j["plan"]["consumers"].get<int64_t>());
  const int64_t producers = j["plan"]["producers"].get<int64_t>();
  EXPECT_EQ(planned->producers.empty() ? 0 : planned->producers[0].count, producers);
  absl::StatusOr<RequestedMode> policy = ParseRequestedMode(j["plan"]["policy"].get<std::string>());
  ASSERT_TRUE(policy.ok());
  EXPECT_THAT(testing::ReadFile(dir + "/a/deployment.toml"),
              HasSubstr("requests ask mode \"" + RequestedModeName(*policy) + "\""));
  absl::StatusOr<PlanOutcome> again = EvaluatePlan(*planned, PlanWorkload(*w, *policy), 2, 60);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->attainment, j["plan"]["attainment"].get<double>());
  EXPECT_THAT(testing::ReadFile(dir + "/a/plan.md"), HasSubstr("| plan |"));

  // Deterministic: a second process writes the same plan.
  ASSERT_EQ(Plan(workload, dir + "/b").status, 0);
  EXPECT_EQ(testing::ReadFile(dir + "/b/plan.json"), testing::ReadFile(dir + "/a/plan.json"));
  fs::remove_all(dir);
}

TEST(PlanCommandTest, WhereNothingMeetsItSaysTheNearestAndFails) {
  const std::string dir = fs::temp_directory_path() / ("scd-plan-none-" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string workload = dir + "/workload.toml";
  testing::WriteFile(workload, kWorkload);
  const PlanRun run = Plan(workload, dir + "/o", 1, 1);
  EXPECT_EQ(run.status, 1);
  EXPECT_THAT(run.output, HasSubstr("no deployment within 1 producers and 1 consumers"));
  EXPECT_THAT(run.output, HasSubstr("the nearest"));
  EXPECT_THAT(testing::ReadFile(dir + "/o/plan.md"), HasSubstr("none within the bounds"));
  EXPECT_FALSE(fs::exists(dir + "/o/deployment.toml"));
  // And a workload without an SLO has nothing to plan for.
  testing::WriteFile(workload, "[workload]\nrate = 1\n[[mix]]\ntarget = \"fables\"\n");
  const PlanRun no_slo = Plan(workload, dir + "/p");
  EXPECT_EQ(no_slo.status, 1);
  EXPECT_THAT(no_slo.output, HasSubstr("plan needs an SLO"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace scd::bench
