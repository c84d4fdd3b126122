// SimRequests (bench/sim_requests.h): arrivals at the workload's rate (a Poisson count within
// four standard deviations; a constant rate exactly), lengths within their bounds and the
// lognormal's mean, the mix by weight, shared-prefix blocks shared exactly within a tenant's
// group, and the same requests for a seed.
#include "bench/sim_requests.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace scd::bench {
namespace {

SimWorkload Base() {
  SimWorkload w;
  w.duration_s = 100;
  w.rate = 50;
  SimMix a, b;
  a.target = "a";
  a.weight = 3;
  b.target = "b";
  b.weight = 1;
  w.mix = {a, b};
  return w;
}

std::vector<SimRequest> All(const SimWorkload& w) { return DrawSimRequests(w); }

TEST(SimRequestsTest, ArrivalsFollowTheRateAndTheMixItsWeights) {
  SimWorkload w = Base();
  const std::vector<SimRequest> poisson = All(w);
  // 5,000 expected; a Poisson count's standard deviation is its mean's root (~71).
  EXPECT_NEAR(static_cast<double>(poisson.size()), 5000, 4 * std::sqrt(5000.0));
  int first = 0;
  for (size_t i = 0; i < poisson.size(); ++i) {
    EXPECT_EQ(poisson[i].id, i);
    if (i > 0) {
      EXPECT_GE(poisson[i].arrival_s, poisson[i - 1].arrival_s);
    }
    EXPECT_LE(poisson[i].arrival_s, w.duration_s);
    first += poisson[i].mix == 0;
  }
  // Weight 3 of 4: a binomial share, 4 standard deviations.
  const double n = static_cast<double>(poisson.size());
  EXPECT_NEAR(first / n, 0.75, 4 * std::sqrt(0.75 * 0.25 / n));
  w.arrivals = SimArrivals::kConstant;
  EXPECT_EQ(All(w).size(), 5000u);  // at 0.02, 0.04, ... 100 s
  w.arrivals = SimArrivals::kGamma;
  w.burstiness = 0.25;  // burstier, the same mean rate
  EXPECT_NEAR(static_cast<double>(All(w).size()), 5000, 8 * std::sqrt(5000.0 / 0.25));
}

TEST(SimRequestsTest, LengthsStayInTheirBoundsAndTheLognormalKeepsItsMean) {
  SimWorkload w = Base();
  w.prompt = {SimLengthKind::kLogNormal, 0, 1, 100000, 300, 0.5};
  w.output = {SimLengthKind::kUniform, 0, 10, 20};
  const std::vector<SimRequest> all = All(w);
  double sum = 0;
  for (const SimRequest& r : all) {
    sum += static_cast<double>(r.prompt_tokens);
    EXPECT_GE(r.output_tokens, 10);
    EXPECT_LE(r.output_tokens, 20);
  }
  // The lognormal's standard deviation is mean * sqrt(exp(sigma^2) - 1) (~159); its mean's over
  // n draws that over sqrt(n).
  const double n = static_cast<double>(all.size());
  EXPECT_NEAR(sum / n, 300, 4 * 300 * std::sqrt(std::exp(0.25) - 1) / std::sqrt(n));
  w.prompt = {SimLengthKind::kLogNormal, 0, 100, 200, 300, 1.0};
  for (const SimRequest& r : All(w)) {
    EXPECT_GE(r.prompt_tokens, 100);
    EXPECT_LE(r.prompt_tokens, 200);
  }
}

TEST(SimRequestsTest, AGroupsRequestsShareItsPrefixBlocksAndNothingElse) {
  SimWorkload w = Base();
  w.prompt = {SimLengthKind::kUniform, 0, 64, 512};
  w.prefix_groups = 3;
  w.tenants = 2;
  w.prefix_share = 0.5;
  const std::vector<SimRequest> all = All(w);
  int shared_pairs = 0;
  for (size_t i = 0; i + 1 < all.size() && i < 400; ++i) {
    const SimRequest &a = all[i], &b = all[i + 1];
    EXPECT_EQ(static_cast<int64_t>(a.blocks.size()), (a.prompt_tokens - 1) / 16);
    EXPECT_EQ(a.shared_blocks, a.prompt_tokens / 2 / 16);
    size_t common = 0;
    while (common < a.blocks.size() && common < b.blocks.size() &&
           a.blocks[common] == b.blocks[common]) {
      ++common;
    }
    const bool same = a.tenant == b.tenant && a.group == b.group;
    EXPECT_EQ(static_cast<int64_t>(common),
              same ? std::min(a.shared_blocks, b.shared_blocks) : int64_t{0});
    shared_pairs += same;
  }
  EXPECT_GT(shared_pairs, 0);
}

TEST(SimRequestsTest, ASeedGivesTheSameRequests) {
  SimWorkload w = Base();
  w.prompt = {SimLengthKind::kLogNormal, 0, 1, 1000, 100, 0.7};
  const std::vector<SimRequest> a = All(w), b = All(w);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].arrival_s, b[i].arrival_s);
    EXPECT_EQ(a[i].prompt_tokens, b[i].prompt_tokens);
    EXPECT_EQ(a[i].blocks, b[i].blocks);
  }
  w.seed = 2;
  const std::vector<SimRequest> c = All(w);
  EXPECT_NE(c.size() == a.size() ? c[0].arrival_s : -1, a[0].arrival_s);
}

}  // namespace
}  // namespace scd::bench
