// The validation's replay and figures (bench/sim_validation.h): a replayed request's prompt
// shares exactly its group's prefix blocks with the other requests of its tenant's group and
// nothing else, asks what the workload drew (mode, output length, tenant, arrival); the figures
// against values worked by hand; the errors and spread against their definitions.
#include "bench/sim_validation.h"

#include <gtest/gtest.h>

#include <cmath>

#include "base/prefix_hash.h"

namespace scd::bench {
namespace {

SimWorkload Workload() {
  SimWorkload w;
  w.duration_s = 20;
  w.seed = 7;
  w.rate = 5;
  w.prompt = {SimLengthKind::kUniform, 0, 40, 200, 0, 0};
  w.output = {SimLengthKind::kUniform, 0, 4, 40, 0, 0};
  w.prefix_groups = 3;
  w.prefix_share = 0.5;
  w.tenants = 2;
  w.mix = {{"fables", RequestedMode::Auto(), 1}, {"fables", TransferMode::kLocal, 1}};
  w.ttft_slo_ms = 100;
  w.tpot_slo_ms = 10;
  return w;
}

// The length of the common start of two id lists.
size_t Common(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

TEST(SimValidationTest, AReplaySharesExactlyEachGroupsPrefixBlocks) {
  const SimWorkload w = Workload();
  const std::vector<SimRequest> requests = DrawSimRequests(w);
  ASSERT_GT(requests.size(), 50u);  // about 100 at 5/s for 20 s
  const absl::StatusOr<SimReplay> replay = ReplayOf(requests, w, 512);
  ASSERT_TRUE(replay.ok()) << replay.status();
  ASSERT_EQ(replay->prompts.size(), requests.size());
  EXPECT_EQ(replay->target, "fables");
  int shared_pairs = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const SimRequest& r = requests[i];
    const BenchPrompt& p = replay->prompts[i];
    EXPECT_EQ(static_cast<int64_t>(p.ids.size()), r.prompt_tokens);
    EXPECT_EQ(p.output_len, r.output_tokens);
    EXPECT_EQ(*p.mode, r.mix == 0 ? "auto" : "local");
    EXPECT_EQ(*p.cache_salt, "tenant-" + std::to_string(r.tenant));
    EXPECT_EQ(replay->arrivals_s[i], r.arrival_s);
    for (int32_t id : p.ids) ASSERT_TRUE(id >= 3 && id < 512) << id;
    for (size_t j = 0; j < i; ++j) {
      const SimRequest& q = requests[j];
      const size_t common = Common(p.ids, replay->prompts[j].ids);
      if (r.tenant == q.tenant && r.group == q.group) {
        // The blocks both reach, then (almost surely) a differing id.
        const auto both =
            static_cast<size_t>(std::min(r.shared_blocks, q.shared_blocks)) * kPrefixBlockTokens;
        EXPECT_GE(common, both);
        EXPECT_LT(common, both + 3) << "requests " << q.id << " and " << r.id;
        shared_pairs += both > 0 ? 1 : 0;
      } else {
        EXPECT_LT(common, 3u) << "requests " << q.id << " and " << r.id << " share ids";
      }
    }
  }
  EXPECT_GT(shared_pairs, 100);
  // One target per replay; a vocabulary with no room for ids.
  SimWorkload two = w;
  two.mix.push_back({"other", TransferMode::kLocal, 1});
  EXPECT_EQ(ReplayOf(requests, two, 512).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReplayOf(requests, w, 4).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SimValidationTest, FiguresOfARealAndASimulatedRunByHand) {
  SimWorkload w = Workload();
  w.duration_s = 2;
  ServeBenchResult real;
  real.requests = 4;
  // TTFT 50 ms, TPOT (e2el - ttft) / (n - 1) = 5 ms: good. TTFT 150 ms: not good. A failure.
  // TTFT 80 ms, TPOT 20 ms: not good.
  auto stream = [](bool ok, double ttft, double e2el, int64_t n, v1::TransferMode mode) {
    StreamRecord s;
    s.ok = ok;
    s.ttft_s = ttft;
    s.e2el_s = e2el;
    s.output_tokens = n;
    s.finished.set_transfer_mode(mode);
    return s;
  };
  real.streams = {stream(true, 0.05, 0.05 + 0.005 * 10, 11, v1::TRANSFER_MODE_LOCAL),
                  stream(true, 0.15, 0.15 + 0.005 * 10, 11, v1::TRANSFER_MODE_SCD),
                  stream(false, 0, 0.01, 0, v1::TRANSFER_MODE_UNSPECIFIED),
                  stream(true, 0.08, 0.08 + 0.02 * 10, 11, v1::TRANSFER_MODE_SCD)};
  const RunFigures f = FiguresOf(real, w);
  EXPECT_EQ(f.requests, 4);
  EXPECT_EQ(f.completed, 3);
  EXPECT_EQ(f.good, 1);
  EXPECT_DOUBLE_EQ(f.goodput, 0.5);  // 1 good over the workload's 2 s
  EXPECT_NEAR(f.ttft_p50_ms, 80, 1e-9);
  EXPECT_NEAR(f.ttft_p90_ms, 80 + 0.8 * 70, 1e-9);  // numpy's linear interpolation
  EXPECT_NEAR(f.tpot_p50_ms, 5, 1e-9);
  EXPECT_NEAR(f.tpot_p90_ms, 5 + 0.8 * 15, 1e-9);
  EXPECT_EQ(f.modes, (std::map<std::string, int64_t>{{"local", 1}, {"scd", 2}}));

  ClusterSimResult sim;
  SimRequestResult a, b;
  a.ttft_s = 0.05, a.e2el_s = 0.1, a.output_tokens = 11, a.mode = TransferMode::kScd;
  b.code = absl::StatusCode::kResourceExhausted;
  sim.requests = {a, b};
  const RunFigures s = FiguresOf(sim, w);
  EXPECT_EQ(s.requests, 2);
  EXPECT_EQ(s.completed, 1);
  EXPECT_EQ(s.good, 1);
  EXPECT_NEAR(s.tpot_p90_ms, 5, 1e-9);
  EXPECT_EQ(s.modes, (std::map<std::string, int64_t>{{"scd", 1}}));
}

TEST(SimValidationTest, ErrorsAgainstTheBoundsAndTheSpreadOverSeeds) {
  RunFigures real, sim;
  real.goodput = 10, sim.goodput = 9.5;           // 5 %: within 10 %
  real.ttft_p50_ms = 100, sim.ttft_p50_ms = 120;  // 20 %: over 15 %
  real.ttft_p90_ms = 200, sim.ttft_p90_ms = 170;  // 15 %: within
  real.tpot_p50_ms = 0, sim.tpot_p50_ms = 0;      // both 0: 0
  real.tpot_p90_ms = 0, sim.tpot_p90_ms = 1;      // only real 0: 1
  const std::vector<FigureError> e = CompareFigures(real, sim);
  ASSERT_EQ(e.size(), 5u);
  EXPECT_EQ(e[0].figure, "goodput");
  EXPECT_NEAR(e[0].error, 0.05, 1e-12);
  EXPECT_EQ(e[0].bound, kGoodputBound);
  EXPECT_TRUE(e[0].within());
  EXPECT_NEAR(e[1].error, 0.2, 1e-12);
  EXPECT_FALSE(e[1].within());
  EXPECT_NEAR(e[2].error, 0.15, 1e-12);
  EXPECT_TRUE(e[2].within());
  EXPECT_EQ(e[3].error, 0);
  EXPECT_EQ(e[4].error, 1);

  RunFigures x, y, z;
  x.goodput = 1, y.goodput = 2, z.goodput = 3;
  const std::vector<FigureSpread> s = SpreadOf({x, y, z});
  ASSERT_EQ(s.size(), 5u);
  EXPECT_EQ(s[0].figure, "goodput");
  EXPECT_DOUBLE_EQ(s[0].mean, 2);
  EXPECT_DOUBLE_EQ(s[0].std, 1);  // sample standard deviation
  EXPECT_DOUBLE_EQ(s[1].std, 0);
  EXPECT_TRUE(SpreadOf({}).empty());
}

}  // namespace
}  // namespace scd::bench
