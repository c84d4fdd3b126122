// `scd-bench validate` (bench/validate_command.h) end to end, small: a workload of a few seconds
// replayed on real daemons under CPU quotas (the stories260k pair, a real artifact fitted here;
// a producer and two consumer replicas) and simulated over two seeds. What must hold whatever
// the machine's speed: every replayed request finishes; the modes the real daemons ran are the
// ones the workload drew (the replay sent each request's own) and the ones the simulator ran for
// the same requests; each node had its quota; the files are written. A twin the emulated
// deployment cannot be is refused before anything starts. Needs root and cgroup v1's cpu
// controller; skipped with the reason elsewhere.
#include "bench/validate_command.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "base/cpu_quota.h"
#include "bench/quick_artifact.h"
#include "tests/test_files.h"

namespace scd::bench {
namespace {

namespace fs = std::filesystem;

std::string Twin(int coordinators) {
  const std::string profiles = std::string(SCD_SOURCE_DIR) + "/bench/cluster/validation/profiles";
  return "[deployment]\nname = \"twin\"\ncoordinators = " + std::to_string(coordinators) +
         "\n[[producer_pool]]\nname = \"stories260k\"\nprofile = \"" + profiles +
         "/tinystories-4m.producer.toml\"\nprefix_cache_mb = 8\n"
         "[[consumer_pool]]\nname = \"fables\"\nprofile = \"" +
         profiles +
         "/tinystories-4m-fables.consumer.toml\"\ncount = 2\nprefix_cache_mb = 8\n"
         "producer = \"stories260k\"\ncode_bytes_per_token = 200\ncode_kl = 0.05\nlayers = 5\n";
}

constexpr char kWorkload[] = R"([workload]
duration_s = 4
seed = 5
rate = 3
[prompt]
distribution = "uniform"
min = 16
max = 64
[output]
distribution = "fixed"
tokens = 8
[prefix]
groups = 2
share = 0.5
[[mix]]
target = "fables"
mode = "local"
[[mix]]
target = "fables"
mode = "scd"
[slo]
ttft_ms = 5000
)";

TEST(ValidateCommandTest, AReplayOnQuotaNodesRunsTheModesTheSimulatorRuns) {
  {
    absl::StatusOr<std::unique_ptr<CpuQuotaGroups>> groups = CpuQuotaGroups::Create();
    if (!groups.ok()) GTEST_SKIP() << groups.status();
  }
  const std::string dir = fs::temp_directory_path() / ("scd-validate-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string bin = testing::BuildDir() + "/bin";
  ValidateOptions o;
  o.deployment = dir + "/twin.toml";
  o.workloads = {dir + "/small.toml"};
  o.out = dir + "/out";
  o.bin_dir = bin;
  o.seeds = 2;
  o.quota_period_ms = 3;
  o.progress = false;
  o.producer_model = testing::ModelDir("stories260k");
  o.consumer_model = testing::ModelDir("stories260k-fables");
  testing::WriteFile(o.workloads[0], kWorkload);
  testing::WriteFile(o.deployment, Twin(2));
  EXPECT_EQ(RunValidation(o).status().code(), absl::StatusCode::kInvalidArgument);
  testing::WriteFile(o.deployment, Twin(1));
  absl::StatusOr<std::string> artifact = FitQuickArtifact(
      bin, testing::SharedDir(), o.producer_model, o.consumer_model, dir + "/pair.scd");
  ASSERT_TRUE(artifact.ok()) << artifact.status();
  o.artifact = *artifact;
  fs::create_directories(o.out);

  absl::StatusOr<std::vector<WorkloadValidation>> r = RunValidation(o);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 1u);
  const WorkloadValidation& v = (*r)[0];
  ASSERT_TRUE(v.ran_real);
  const int64_t drawn = static_cast<int64_t>(DrawSimRequests(v.workload).size());
  ASSERT_GT(drawn, 3);
  EXPECT_EQ(v.real.requests, drawn);
  EXPECT_EQ(v.real.completed, drawn) << ValidationJson(*r);
  EXPECT_EQ(v.simulated.requests, drawn);
  EXPECT_EQ(v.real.modes, v.simulated.modes) << ValidationJson(*r);
  EXPECT_EQ(v.seeds.size(), 2u);
  EXPECT_EQ(v.errors.size(), 5u);
  ASSERT_EQ(v.throttling.size(), 3u);  // the producer and the two consumers
  for (const auto& [node, t] : v.throttling) EXPECT_GT(t.periods, 0) << node;
  EXPECT_TRUE(fs::exists(o.out + "/small.real.json"));
  EXPECT_TRUE(fs::exists(o.out + "/small.simulated.json"));
  const nlohmann::json j = nlohmann::json::parse(ValidationJson(*r));
  EXPECT_EQ(j["workloads"][0]["workload"], "small");
  EXPECT_EQ(j["workloads"][0]["errors"].size(), 5u);
  EXPECT_NE(ValidationTable(*r).find("| small | goodput |"), std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace scd::bench
