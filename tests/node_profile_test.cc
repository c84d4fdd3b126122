// NodeProfile (bench/node_profile.h): written and read back exactly, its costs against their
// formulas summed by hand, and every bound of the file refused with a message naming it.
#include "bench/node_profile.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace scd::bench {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

NodeProfile Consumer() {
  NodeProfile p;
  p.role = NodeRole::kConsumer;
  p.model = "stories260k";
  p.machine = "AMD EPYC, 2 cores, \"quota\" 0.5";
  p.cpu_quota = 0.5;
  p.prefill = {123.456789012345, 0.1, 1e-7};
  p.rebuild = {55.5, 3.3333333333333335};
  p.first_decode = {900, 0.25};
  p.decode_step = {410.0, 37.125, 0.0031};
  p.local_itl_us = 2.5;
  p.rebuild_itl_us = 0.75;
  p.busy_prefill_us = 19.0;
  p.api_overhead_us = 4321.5;
  p.idle = {240000, 1.25, 1.625, 5000.25};
  p.step_noise = {0.875, 1, 1.25, 3};
  p.kv_bytes_per_token = 1280;
  p.kv_budget_bytes = int64_t{10} << 20;
  p.capacity = 16;
  p.step_rows = 512;
  return p;
}

NodeProfile Producer() {
  NodeProfile p;
  p.role = NodeRole::kProducer;
  p.model = "tinystories-4m";
  p.prefill = {80.0, 11.0, 0.002};
  p.encode = {12.0, 0.4};
  p.link_goodput_gbps = 0.00025;
  p.link_latency_us = 4e6;
  return p;
}

void ExpectSame(const NodeProfile& a, const NodeProfile& b) {
  // Exact: the file keeps 17 significant digits.
  EXPECT_EQ(a.role, b.role);
  EXPECT_EQ(a.model, b.model);
  EXPECT_EQ(a.machine, b.machine);
  EXPECT_EQ(a.cpu_quota, b.cpu_quota);
  EXPECT_EQ(a.prefill.fixed_us, b.prefill.fixed_us);
  EXPECT_EQ(a.prefill.per_token_us, b.prefill.per_token_us);
  EXPECT_EQ(a.prefill.per_token_context_us, b.prefill.per_token_context_us);
  for (auto [x, y] : std::initializer_list<std::pair<LineCost, LineCost>>{
           {a.encode, b.encode}, {a.rebuild, b.rebuild}, {a.first_decode, b.first_decode}}) {
    EXPECT_EQ(x.fixed_us, y.fixed_us);
    EXPECT_EQ(x.per_token_us, y.per_token_us);
  }
  EXPECT_EQ(a.decode_step.fixed_us, b.decode_step.fixed_us);
  EXPECT_EQ(a.decode_step.per_sequence_us, b.decode_step.per_sequence_us);
  EXPECT_EQ(a.decode_step.per_context_token_us, b.decode_step.per_context_token_us);
  EXPECT_EQ(a.local_itl_us, b.local_itl_us);
  EXPECT_EQ(a.rebuild_itl_us, b.rebuild_itl_us);
  EXPECT_EQ(a.busy_prefill_us, b.busy_prefill_us);
  EXPECT_EQ(a.api_overhead_us, b.api_overhead_us);
  EXPECT_EQ(a.idle.after_us, b.idle.after_us);
  EXPECT_EQ(a.idle.slowdown_p50, b.idle.slowdown_p50);
  EXPECT_EQ(a.idle.slowdown_p90, b.idle.slowdown_p90);
  EXPECT_EQ(a.idle.api_overhead_us, b.idle.api_overhead_us);
  EXPECT_EQ(a.step_noise.p10, b.step_noise.p10);
  EXPECT_EQ(a.step_noise.p50, b.step_noise.p50);
  EXPECT_EQ(a.step_noise.p90, b.step_noise.p90);
  EXPECT_EQ(a.step_noise.p99, b.step_noise.p99);
  EXPECT_EQ(a.kv_bytes_per_token, b.kv_bytes_per_token);
  EXPECT_EQ(a.kv_budget_bytes, b.kv_budget_bytes);
  EXPECT_EQ(a.capacity, b.capacity);
  EXPECT_EQ(a.step_rows, b.step_rows);
  EXPECT_EQ(a.link_goodput_gbps, b.link_goodput_gbps);
  EXPECT_EQ(a.link_latency_us, b.link_latency_us);
}

TEST(NodeProfileTest, WrittenAndReadBackExactlyForBothRoles) {
  for (const NodeProfile& profile : {Consumer(), Producer()}) {
    SCOPED_TRACE(NodeRoleName(profile.role));
    ASSERT_TRUE(CheckNodeProfile(profile).ok()) << CheckNodeProfile(profile);
    const std::string text = NodeProfileToml(profile);
    absl::StatusOr<NodeProfile> read = ParseNodeProfile(text);
    ASSERT_TRUE(read.ok()) << read.status() << "\n" << text;
    ExpectSame(*read, profile);
    EXPECT_EQ(NodeProfileToml(*read), text);
  }
  // A profile without [idle] reads as no slowdown, and is written without one.
  NodeProfile busy = Producer();
  busy.idle = IdleCost{};
  EXPECT_THAT(NodeProfileToml(busy), Not(HasSubstr("[idle]")));
  absl::StatusOr<NodeProfile> read = ParseNodeProfile(NodeProfileToml(busy));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->idle.after_us, 0);
  EXPECT_EQ(read->idle.Factor(1e9, 3.0), 1);
  // Only the role's tables are written.
  EXPECT_THAT(NodeProfileToml(Producer()), Not(HasSubstr("[decode_step]")));
  EXPECT_THAT(NodeProfileToml(Consumer()), Not(HasSubstr("[link]")));
}

TEST(NodeProfileTest, CostsFollowTheirFormulas) {
  const NodeProfile p = Consumer();
  // The prefill's context term, summed position by position: token i (0-based) of n computed
  // after c cached attends to c + i + 1 positions.
  for (int64_t cached : {0, 37}) {
    for (int64_t n : {1, 2, 450}) {
      double contexts = 0;
      for (int64_t i = 0; i < n; ++i) contexts += static_cast<double>(cached + i + 1);
      const double expected = p.prefill.fixed_us + p.prefill.per_token_us * n +
                              p.prefill.per_token_context_us * contexts;
      EXPECT_DOUBLE_EQ(p.prefill.At(n, cached), expected) << n << " after " << cached;
    }
  }
  EXPECT_DOUBLE_EQ(p.decode_step.At(8, 4000), 410.0 + 8 * 37.125 + 4000 * 0.0031);
  EXPECT_DOUBLE_EQ(p.rebuild.At(100), 55.5 + 100 * 3.3333333333333335);
  // 125,000 bytes on a 1 Gbit/s link: 1 ms, after the latency.
  // The idle slowdown: its median at z = 0 after the measured idle or longer, its p90 at the
  // normal's 90th percentile, a share of either after less (240 ms measured: 60 ms is a
  // quarter), none after no idle, never under 1.
  const IdleCost& idle = p.idle;
  EXPECT_DOUBLE_EQ(idle.Factor(240000, 0), 1.25);
  EXPECT_DOUBLE_EQ(idle.Factor(1e7, 0), 1.25);
  EXPECT_NEAR(idle.Factor(240000, 1.2815515655446004), 1.625, 1e-12);
  EXPECT_DOUBLE_EQ(idle.Factor(60000, 0), 1 + 0.25 * 0.25);
  EXPECT_EQ(idle.Factor(0, 5.0), 1);
  EXPECT_EQ(idle.Factor(240000, -10.0), 1);
  EXPECT_DOUBLE_EQ(idle.Share(120000), 0.5);
  // The step noise: the quantile function through p10..p99 over its mean (by hand: 0.1 * 0.875
  // + 0.4 * 0.9375 + 0.4 * 1.125 + 0.09 * 2.125 + 0.01 * 3 = 1.13375), so the factors average 1
  // (a fine grid of u); p50's draw is p50 / mean; none measured: 1.
  const StepNoise& noise = p.step_noise;
  const double mean = 1.13375;
  EXPECT_DOUBLE_EQ(noise.Factor(0.5), 1 / mean);
  EXPECT_DOUBLE_EQ(noise.Factor(0.05), 0.875 / mean);
  EXPECT_DOUBLE_EQ(noise.Factor(0.995), 3 / mean);
  EXPECT_DOUBLE_EQ(noise.Factor(0.7), (1 + 1.25) / 2 / mean);
  double sum = 0, last = 0;
  constexpr int kGrid = 1000000;
  for (int i = 0; i < kGrid; ++i) {
    const double f = noise.Factor((i + 0.5) / kGrid);
    EXPECT_GE(f, last);
    last = f;
    sum += f;
  }
  EXPECT_NEAR(sum / kGrid, 1, 1e-9);
  EXPECT_EQ(StepNoise{}.Factor(0.99), 1);
  NodeProfile link = Producer();
  link.link_goodput_gbps = 1.0;
  link.link_latency_us = 50;
  EXPECT_DOUBLE_EQ(link.LinkUs(125000), 1050.0);
}

// The text of a valid consumer profile with `from` replaced by `to` (the replacement must land).
std::string Edited(const std::string& from, const std::string& to) {
  const std::string text = NodeProfileToml(Consumer());
  EXPECT_THAT(text, HasSubstr(from));
  return absl::StrReplaceAll(text, {{from, to}});
}

TEST(NodeProfileTest, RefusesWhatIsOutOfBoundsNamingIt) {
  struct Case {
    std::string text, says;
  };
  const std::vector<Case> cases = {
      {Edited("per_sequence_us", "per_sequense_us"), "unknown key decode_step.per_sequense_us"},
      {Edited("[memory]", "[memroy]"), "unknown table [memroy]"},
      {"stray = 1\n" + NodeProfileToml(Consumer()), "unknown key stray"},
      {Edited("cpu_quota = 0.5", "cpu_quota = -0.5"), "node.cpu_quota"},
      {Edited("cpu_quota = 0.5", "cpu_quota = nan"), "node.cpu_quota"},
      {Edited("cpu_quota = 0.5", "cpu_quota = inf"), "node.cpu_quota"},
      {Edited("cpu_quota = 0.5", "cpu_quota = 1e300"), "node.cpu_quota"},
      {Edited("cpu_quota = 0.5", "cpu_quota = \"half\""), "node.cpu_quota"},
      {Edited("capacity = 16", "capacity = 2.5"), "memory.capacity"},
      {Edited("capacity = 16", "capacity = -1"), "memory.capacity"},
      {Edited("capacity = 16", "capacity = 0"), "memory.capacity > 0"},
      {Edited("step_rows = 512", "step_rows = 9007199254740993"), "memory.step_rows"},
      {Edited("role = \"consumer\"", "role = \"decoder\""), "node.role"},
      {Edited("model = \"stories260k\"", "model = \"\""), "node.model"},
      {Edited("model = \"stories260k\"", "model = \"a\\u0007b\""), "node.model"},
      {Edited("model = \"stories260k\"", absl::StrCat("model = \"", std::string(300, 'm'), "\"")),
       "node.model"},
      {Edited("model = \"stories260k\"", "model = 7"), "node.model: not a string"},
      {Edited("[memory]", "[memory]\n[memory]"), "line"},
      {Edited("kv_bytes_per_token = 1280", "kv_bytes_per_token = 0"), "kv_bytes_per_token"},
      {absl::StrReplaceAll(
           NodeProfileToml(Consumer()),
           {{"per_token_us = 0.10000000000000001", "per_token_us = 0.0"},
            {"per_token_context_us = 9.9999999999999995e-08", "per_token_context_us = 0.0"}}),
       "prefill.per_token_us or per_token_context_us > 0"},
      {std::string(kMaxProfileBytes + 1, '#'), "at most"},
      {Edited("slowdown_p50 = 1.25", "slowdown_p50 = 0.5"), "idle.slowdown_p50"},
      {Edited("slowdown_p90 = 1.625", "slowdown_p90 = 1.125"),
       "idle.slowdown_p90 at least idle.slowdown_p50"},
      {Edited("after_us = 240000", "after_ms = 240"), "unknown key idle.after_ms"},
      {Edited("p90 = 1.25", "p90 = 0.5"), "step_noise 0 < p10 <= p50 <= p90 <= p99"},
      {Edited("p99 = 3.0", "p99 = 0.0"), "step_noise 0 < p10 <= p50 <= p90 <= p99"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<NodeProfile> read = ParseNodeProfile(c.text);
    ASSERT_FALSE(read.ok()) << c.says;
    EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(read.status().message(), HasSubstr(c.says)) << read.status();
  }
  // A producer without a link, a consumer without its memory.
  NodeProfile producer = Producer();
  producer.link_goodput_gbps = 0;
  EXPECT_THAT(CheckNodeProfile(producer).message(), HasSubstr("link.goodput_gbps"));
  NodeProfile consumer = Consumer();
  consumer.kv_budget_bytes = 100;  // under one token's 1280 bytes
  EXPECT_THAT(CheckNodeProfile(consumer).message(), HasSubstr("kv_budget_bytes"));
  // A decode step may carry its cost in any term, but must cost something.
  consumer = Consumer();
  consumer.decode_step = {0, 0, 0.5};
  EXPECT_TRUE(CheckNodeProfile(consumer).ok());
  consumer.decode_step = {0, 0, 0};
  EXPECT_THAT(CheckNodeProfile(consumer).message(), HasSubstr("a decode_step cost > 0"));
}

TEST(NodeProfileTest, ReadFromAFileNamingThePathWhenItCannot) {
  const std::string path = ::testing::TempDir() + "/node_profile_test.toml";
  {
    std::ofstream out(path);
    out << NodeProfileToml(Producer());
  }
  absl::StatusOr<NodeProfile> read = ReadNodeProfile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  ExpectSame(*read, Producer());
  {
    std::ofstream out(path);
    out << std::string(kMaxProfileBytes + 1, '#');
  }
  EXPECT_THAT(ReadNodeProfile(path).status().message(), HasSubstr(path));
  EXPECT_EQ(ReadNodeProfile(path + ".missing").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace scd::bench
