// `scd-bench simulate` (bench/simulate_command.h) as a user runs it: the committed example
// deployment under a short workload, twice in separate processes -- the same JSON both times (a
// seed's run is deterministic), every request accounted for, the report's fields where a reader
// of `scd-bench serve`'s looks for them; another seed gives another run.
#include "bench/simulate_command.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/child_process.h"
#include "tests/test_files.h"

namespace scd::bench {
namespace {

namespace fs = std::filesystem;

// The JSON a run wrote (--out).
std::string Simulate(const std::string& workload, const std::string& seed, const std::string& out,
                     bool per_request = false) {
  std::vector<std::string> argv = {
      testing::BuildDir() + "/bin/scd-bench",
      "simulate",
      "--deployment",
      std::string(SCD_SOURCE_DIR) + "/bench/cluster/example_deployment.toml",
      "--workload",
      workload,
      "--seed",
      seed,
      "--out",
      out};
  if (per_request) argv.push_back("--per-request");
  absl::StatusOr<ChildProcess::Outcome> run = ChildProcess::Run(argv);
  EXPECT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->status, 0) << run->output;
  return testing::ReadFile(out);
}

TEST(SimulateCommandTest, TheSameSeedGivesTheSameJsonInTwoProcesses) {
  const std::string dir = fs::temp_directory_path() / ("scd-simulate-" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string workload = dir + "/workload.toml";
  testing::WriteFile(
      workload,
      "[workload]\nduration_s = 30\nrate = 15\n[prompt]\ndistribution = \"uniform\"\n"
      "min = 16\nmax = 300\n[output]\ntokens = 24\n[prefix]\ngroups = 4\nshare = 0.5\n"
      "[[mix]]\ntarget = \"fables\"\nmode = \"auto\"\n[slo]\nttft_ms = 200\n");
  const std::string a = Simulate(workload, "3", dir + "/a.json");
  const std::string b = Simulate(workload, "3", dir + "/b.json");
  EXPECT_EQ(a, b);
  const nlohmann::json j = nlohmann::json::parse(a, nullptr, false);
  ASSERT_TRUE(j.is_object()) << a;
  // 15/s over 30 s, Poisson: 450 expected (sd ~21).
  EXPECT_GT(j["requests"].get<int>(), 350);
  EXPECT_EQ(j["requests"].get<int>(), j["completed"].get<int>() + j["failed"].get<int>());
  EXPECT_GT(j["ttft"]["percentiles_ms"]["p90"].get<double>(), 0);
  EXPECT_GT(j["tpot"]["median_ms"].get<double>(), 0);
  EXPECT_EQ(j["nodes"].size(), 2u + 6u);
  EXPECT_NE(Simulate(workload, "4", dir + "/c.json"), a);
  EXPECT_FALSE(j.contains("per_stream"));
  // Each request's figures on asking: one entry per request, the completed ones' TTFTs the
  // summary's (their mean), the rest marked by their code.
  const nlohmann::json d =
      nlohmann::json::parse(Simulate(workload, "3", dir + "/d.json", true), nullptr, false);
  ASSERT_TRUE(d.contains("per_stream")) << d.dump();
  const nlohmann::json& ps = d["per_stream"];
  ASSERT_EQ(ps["ttft_ms"].size(), j["requests"].get<size_t>());
  double sum = 0;
  int ok = 0;
  for (size_t i = 0; i < ps["ttft_ms"].size(); ++i) {
    if (ps["code"][i] != "OK") continue;
    ++ok;
    sum += ps["ttft_ms"][i].get<double>();
    EXPECT_GE(ps["e2el_ms"][i].get<double>(), ps["ttft_ms"][i].get<double>());
  }
  EXPECT_EQ(ok, j["completed"].get<int>());
  EXPECT_NEAR(sum / ok, j["ttft"]["mean_ms"].get<double>(), 1e-9 * sum);
  // And each consumer's step log: over 30 s, a line after 10 and 20 s where it stepped then (a
  // consumer the router left idle writes none, as the daemon).
  size_t lines = 0;
  for (const nlohmann::json& node : d["nodes"]) {
    if (node["role"] != "consumer") continue;
    ASSERT_LE(node["step_log"].size(), 2u) << node.dump();
    for (const nlohmann::json& line : node["step_log"]) {
      // A window of at least 10 s: longer where the consumer stepped nothing past its end.
      double t = 0, over = 0;
      ASSERT_EQ(std::sscanf(line.get<std::string>().c_str(), "t=%lf steps over %lf s:", &t, &over),
                2)
          << line;
      EXPECT_GE(over, 9.95) << line;
      EXPECT_LE(t, 30 + 600) << line;  // within the run and its drain
      ++lines;
    }
  }
  EXPECT_GE(lines, 6u);
  // Each node's use over time: a share per bin of a hundredth of the 30 s to the run's end,
  // adding up to its busy share of the whole run; producers' links too.
  ASSERT_EQ(j["timeline_bin_s"].get<double>(), 0.3);
  const auto bins = static_cast<size_t>(std::ceil(j["simulated_s"].get<double>() / 0.3));
  for (const nlohmann::json& node : j["nodes"]) {
    const bool producer = node["role"] == "producer";
    for (const char* key : {"busy_over_time", "link_over_time"}) {
      if (!producer && std::string(key) == "link_over_time") {
        EXPECT_FALSE(node.contains(key));
        continue;
      }
      ASSERT_EQ(node[key].size(), bins) << node["name"];
      double sum = 0;
      for (const nlohmann::json& share : node[key]) {
        EXPECT_LE(share.get<double>(), 1 + 1e-9);
        sum += share.get<double>() * 0.3;
      }
      const double total =
          node[key == std::string("busy_over_time") ? "busy" : "link"].get<double>() *
          j["simulated_s"].get<double>();
      EXPECT_NEAR(sum, total, 1e-6 * std::max(1.0, total)) << node["name"] << " " << key;
    }
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace scd::bench
