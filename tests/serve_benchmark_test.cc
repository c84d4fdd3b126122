// scd-bench serve (issue 16): a 10-request Poisson load on a real all-in-one server process;
// the benchmark's client-side counts, token totals and TTFTs are checked against the server's
// own Finished events and the coordinator's counter of routed requests; percentiles against an
// independent computation; the command line writes its JSON per rate and the rate plot.
#include "bench/serve_benchmark.h"

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "proto/wire_mode.h"
#include "scd/v1/registry.grpc.pb.h"
#include "tests/test_daemon.h"
#include "tests/test_files.h"

namespace scd::bench {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::Bin;
using testing::Daemon;

class ServeBenchmarkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<Daemon>(
        temp_.path(), "all-in-one",
        std::vector<std::string>{Bin("scd"), "serve", "--all-in-one", "--producer-model",
                                 testing::ModelDir("stories260k"), "--consumer",
                                 "xs=" + testing::ModelDir("llama2xs-260k"), "--consumer",
                                 "copy=" + testing::ModelDir("stories260k"), "--listen",
                                 "127.0.0.1:0", "--capacity", "8"});
    address_ = server_->Address();
    ASSERT_FALSE(address_.empty());
  }

  uint64_t Routed() {
    auto stub = v1::Registry::NewStub(
        grpc::CreateChannel(server_->ControlAddress(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.AddMetadata("x-scd-cluster-secret", testing::kTestClusterSecret);
    v1::NodeStats stats;
    EXPECT_TRUE(stub->Stats(&context, v1::StatsRequest(), &stats).ok());
    return stats.ended().count("routed") ? stats.ended().at("routed") : 0;
  }

  testing::TempDir temp_;
  std::unique_ptr<Daemon> server_;
  std::string address_;
};

// Linear interpolation between closest ranks, as numpy.percentile.
double NumpyPercentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const double rank = p / 100 * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(rank);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (rank - static_cast<double>(lo));
}

TEST_F(ServeBenchmarkTest, TenRequestsMatchTheServersFinishedEvents) {
  const uint64_t routed_before = Routed();
  ServeBenchOptions options;
  options.server = address_;
  options.targets = {"copy"};
  options.mode = "raw";
  options.prompts = RandomPrompts(10, 32, 8, 512, 7, 7);
  options.node_stats = {server_->ControlAddress()};
  options.secret = testing::kTestClusterSecret;
  options.output_len = 12;
  options.request_rate = 20;
  options.seed = 3;
  options.percentiles = {50, 90, 99};
  options.goodput.ttft_ms = 60000;
  int progress = 0;
  options.on_progress = [&](int done, int total) {
    EXPECT_EQ(total, 10);
    progress = std::max(progress, done);
  };
  absl::StatusOr<ServeBenchResult> result = RunServeBenchmark(options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(progress, 10);
  EXPECT_EQ(result->requests, 10);
  EXPECT_EQ(result->completed, 10) << ServeBenchTable(*result);
  EXPECT_EQ(result->failed, 0);
  EXPECT_EQ(Routed() - routed_before, 10u);  // the coordinator's own count
  ASSERT_EQ(result->streams.size(), 10u);
  int64_t server_output = 0, server_input = 0;
  std::vector<double> ttfts_ms;
  for (const StreamRecord& s : result->streams) {
    ASSERT_TRUE(s.ok) << s.error;
    // Tokens counted on the client equal the server's count; one gap per token after the first.
    EXPECT_EQ(s.output_tokens, static_cast<int64_t>(s.finished.output_tokens()));
    EXPECT_EQ(s.itl_s.size(), static_cast<size_t>(s.output_tokens - 1));
    EXPECT_EQ(s.finished.prompt_tokens(), 32u);  // 8 shared + 24 own
    EXPECT_EQ(RanModeName(s.finished), "raw");
    // The client's TTFT includes the server's (measured from receipt) and is within its E2EL.
    EXPECT_GE(s.ttft_s * 1e6, static_cast<double>(s.finished.timings().ttft()) * 0.999);
    EXPECT_LE(s.ttft_s, s.e2el_s);
    EXPECT_LT(s.ttft_s * 1e6 - static_cast<double>(s.finished.timings().ttft()), 2e6);
    server_output += s.finished.output_tokens();
    server_input += s.finished.prompt_tokens();
    ttfts_ms.push_back(s.ttft_s * 1e3);
  }
  EXPECT_EQ(result->output_tokens, server_output);
  EXPECT_EQ(result->input_tokens, server_input);
  EXPECT_EQ(result->ttft.count, 10);
  EXPECT_NEAR(result->ttft.median, NumpyPercentile(ttfts_ms, 50), 1e-9);
  EXPECT_NEAR(result->ttft.percentiles.at(90), NumpyPercentile(ttfts_ms, 90), 1e-9);
  EXPECT_NEAR(result->ttft.percentiles.at(99), NumpyPercentile(ttfts_ms, 99), 1e-9);
  EXPECT_EQ(result->good, 10);  // a one-minute TTFT bound holds for every stream
  // Poisson arrivals at 20 req/s: ten sends spread over time (not all at once), in order.
  EXPECT_GT(result->send_s.back(), 0.05);
  EXPECT_TRUE(std::is_sorted(result->send_s.begin(), result->send_s.end()));
  EXPECT_GT(result->output_throughput, 0);
  // The coordinator's Stats around the run; no prefix cache on this server: nothing cached.
  ASSERT_EQ(result->nodes.size(), 1u);
  EXPECT_EQ(result->nodes[0].role, "coordinator");
  EXPECT_EQ(result->producer_cached_tokens, 0);
  EXPECT_EQ(result->consumer_cached_tokens, 0);
  EXPECT_GT(result->payload_bytes, 0);  // raw: the KV of every prompt crossed
}

// A replayed trace: each request sent at its own time, with its own mode, output length and
// salt (the cluster simulator's validation replays its workloads so); a trace that does not fit
// the prompts is refused before anything is sent.
TEST_F(ServeBenchmarkTest, ATraceSendsEachRequestAtItsTimeWithWhatItAsks) {
  ServeBenchOptions options;
  options.server = address_;
  options.targets = {"copy"};
  options.mode = "raw";
  options.output_len = 12;
  options.prompts = RandomPrompts(3, 24, 0, 512, 5, 5);
  options.prompts[0].mode = "local";
  options.prompts[1].output_len = 5;
  options.prompts[2].cache_salt = "tenant-b";
  options.arrivals_s = {0, 0.6};
  EXPECT_EQ(RunServeBenchmark(options).status().code(), absl::StatusCode::kInvalidArgument);
  options.arrivals_s = {0, 0.6, 0.3};
  EXPECT_EQ(RunServeBenchmark(options).status().code(), absl::StatusCode::kInvalidArgument);
  options.arrivals_s = {0, 0.3, 0.6};
  const absl::StatusOr<ServeBenchResult> run = RunServeBenchmark(options);
  ASSERT_TRUE(run.ok()) << run.status();
  const ServeBenchResult& result = *run;
  ASSERT_EQ(result.streams.size(), 3u);
  for (const StreamRecord& s : result.streams) ASSERT_TRUE(s.ok) << s.error;
  EXPECT_EQ(RanModeName(result.streams[0].finished), "local");
  EXPECT_EQ(RanModeName(result.streams[1].finished), "raw");
  EXPECT_EQ(result.streams[0].output_tokens, 12);
  EXPECT_EQ(result.streams[1].output_tokens, 5);
  EXPECT_EQ(result.streams[2].output_tokens, 12);
  // Not sent before the trace's times (a sleep overshoots, never undershoots), in order.
  for (size_t i = 0; i < 3; ++i) EXPECT_GE(result.send_s[i], options.arrivals_s[i]);
  EXPECT_TRUE(std::is_sorted(result.send_s.begin(), result.send_s.end()));
}

// --input-len counts the whole prompt; the prefix comes from its own seed, so runs with one
// prefix seed share it while their own ids differ.
TEST(RandomPromptsTest, PrefixFromItsOwnSeedOwnIdsFromTheRunSeed) {
  const std::vector<BenchPrompt> a = RandomPrompts(3, 40, 32, 512, 1, 9);
  const std::vector<BenchPrompt> b = RandomPrompts(2, 40, 32, 512, 2, 9);
  const std::vector<BenchPrompt> c = RandomPrompts(1, 40, 32, 512, 1, 10);
  ASSERT_EQ(a.size(), 3u);
  for (const BenchPrompt& p : a) {
    ASSERT_EQ(p.ids.size(), 40u);
    for (int32_t id : p.ids) EXPECT_TRUE(id >= 3 && id < 512);
  }
  auto prefix = [](const BenchPrompt& p) {
    return std::vector<int32_t>(p.ids.begin(), p.ids.begin() + 32);
  };
  auto own = [](const BenchPrompt& p) { return std::vector<int32_t>(p.ids.begin() + 32, p.ids.end()); };
  EXPECT_EQ(prefix(a[0]), prefix(a[2]));
  EXPECT_EQ(prefix(a[0]), prefix(b[0]));
  EXPECT_NE(prefix(a[0]), prefix(c[0]));
  EXPECT_NE(own(a[0]), own(a[1]));
  EXPECT_NE(own(a[0]), own(b[0]));
  EXPECT_EQ(own(a[0]), own(c[0]));  // same run seed, other prefix seed
  EXPECT_EQ(RandomPrompts(1, 8, 32, 512, 1, 9)[0].ids.size(), 32u);  // at least the prefix
}

TEST_F(ServeBenchmarkTest, FailuresAreCountedByStatusCode) {
  ServeBenchOptions options;
  options.server = address_;
  options.targets = {"no-such-model"};
  options.prompts = RandomPrompts(3, 4, 0, 512, 1, 1);
  options.output_len = 2;
  absl::StatusOr<ServeBenchResult> result = RunServeBenchmark(options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->completed, 0);
  EXPECT_EQ(result->failed, 3);
  EXPECT_EQ(result->failures_by_code.at("NOT_FOUND"), 3);
}

TEST_F(ServeBenchmarkTest, CommandLineWritesJsonPerRateAndThePlot) {
  const std::string out = temp_.File("bench");
  const testing::CommandResult run = testing::RunCommand(
      Bin("scd-bench") + " serve --server " + address_ +
      " --targets xs --mode local --num-prompts 4 --input-len 16 --output-len 4"
      " --request-rate 50,inf --goodput ttft:60000 --quiet --out " + out);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.out, HasSubstr("Serving Benchmark Result"));
  EXPECT_THAT(run.out, HasSubstr("P99 TTFT (ms):"));
  for (const char* rate : {"50", "inf"}) {
    const nlohmann::json j =
        nlohmann::json::parse(testing::ReadFile(out + "/serve-" + rate + ".json"));
    EXPECT_EQ(j["completed"], 4);
    EXPECT_EQ(j["per_stream"]["ttft_ms"].size(), 4u);
    EXPECT_TRUE(j["ttft"].contains("p99_ms"));
    EXPECT_EQ(j["good"], 4);
  }
  EXPECT_GT(fs::file_size(out + "/serve.png"), 10000u);
  // Bad input: one line, exit 1.
  const testing::CommandResult bad = testing::RunCommand(
      Bin("scd-bench") + " serve --server " + address_ + " --targets xs --goodput ttft:x");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_THAT(bad.err, HasSubstr("--goodput"));
}

}  // namespace
}  // namespace scd::bench
