// `scd-bench plan`'s search (bench/plan_search.h) against brute force: over analytic
// deployments -- local capacity per consumer, codes' capacity the lesser of the consumers' and the
// producers', demand spread over requests -- whose attainment grows with nodes as the search
// assumes, the search picks the deployment an exhaustive run of every candidate picks, and its
// runner-up, from a fraction of the runs; bounds and errors are refused or passed on.
#include "bench/plan_search.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

namespace scd::bench {
namespace {

using ::testing::HasSubstr;

// Requests/s a deployment serves: local prefill costs a consumer more than a rebuild, codes need
// producers.
struct Capacities {
  double local = 3, codes = 5, producer = 11, demand = 40;
  double Of(const PlanCandidate& c) const {
    const double consumers = static_cast<double>(c.consumers);
    if (c.policy.Is(TransferMode::kLocal)) return consumers * local;
    const double codes_cap =
        std::min(consumers * codes, static_cast<double>(c.producers) * producer);
    if (c.policy.is_auto()) return std::max(codes_cap, consumers * local) + 0.5;
    return c.policy.Is(TransferMode::kRaw) ? 0.8 * codes_cap : codes_cap;
  }
  PlanOutcome Outcome(const PlanCandidate& c) const {
    PlanOutcome o;
    const double served = std::min(Of(c), demand);
    o.attainment = served / demand;
    o.goodput = served;
    return o;
  }
};

// Every candidate run; the minimal ones that meet, best first.
std::vector<PlanEvaluation> BruteForce(const PlanSpace& s, const Capacities& k) {
  std::vector<PlanEvaluation> meets;
  for (RequestedMode policy : s.policies) {
    const bool local = policy.Is(TransferMode::kLocal);
    for (int64_t c = 1; c <= s.max_consumers; ++c) {
      for (int64_t p = local ? 0 : 1; p <= (local ? 0 : s.max_producers); ++p) {
        PlanEvaluation e;
        e.candidate = {policy, p, c};
        e.outcome = k.Outcome(e.candidate);
        e.cost =
            static_cast<double>(p) * s.producer_cost + static_cast<double>(c) * s.consumer_cost;
        e.meets = e.outcome.attainment >= s.attainment;
        if (e.meets) meets.push_back(e);
      }
    }
  }
  std::vector<PlanEvaluation> minimal;
  for (const PlanEvaluation& e : meets) {
    const bool dominated = std::any_of(meets.begin(), meets.end(), [&](const PlanEvaluation& o) {
      return o.candidate.policy == e.candidate.policy &&
             o.candidate.producers <= e.candidate.producers &&
             o.candidate.consumers <= e.candidate.consumers &&
             (o.candidate.producers < e.candidate.producers ||
              o.candidate.consumers < e.candidate.consumers);
    });
    if (!dominated) minimal.push_back(e);
  }
  std::stable_sort(minimal.begin(), minimal.end(), BetterPlan);
  return minimal;
}

std::string Name(const PlanEvaluation& e) {
  return RequestedModeName(e.candidate.policy) + " " + std::to_string(e.candidate.producers) +
         "p " + std::to_string(e.candidate.consumers) + "c";
}

TEST(PlanSearchTest, PicksWhatBruteForcePicksFromAFractionOfTheRuns) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(0, 1);
  int64_t searched = 0, exhaustive = 0;
  for (int trial = 0; trial < 200; ++trial) {
    PlanSpace s;
    s.policies = {RequestedMode(TransferMode::kLocal), RequestedMode(TransferMode::kRaw),
                  RequestedMode(TransferMode::kScd), RequestedMode::Auto()};
    s.max_producers = 1 + static_cast<int64_t>(u(rng) * 8);
    s.max_consumers = 1 + static_cast<int64_t>(u(rng) * 16);
    s.producer_cost = 0.5 + u(rng) * 2;
    s.consumer_cost = 0.5 + u(rng) * 2;
    s.attainment = 0.5 + u(rng) * 0.5;
    Capacities k;
    k.local = 1 + u(rng) * 4;
    k.codes = k.local * (1 + u(rng) * 2);
    k.producer = 2 + u(rng) * 20;
    k.demand = 5 + u(rng) * 40;
    const std::vector<PlanEvaluation> truth = BruteForce(s, k);
    int64_t runs = 0;
    absl::StatusOr<PlanResult> r = SearchPlan(s, [&](const PlanCandidate& c) {
      ++runs;
      return absl::StatusOr<PlanOutcome>(k.Outcome(c));
    });
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(static_cast<int64_t>(r->evaluated.size()), runs);  // each candidate run once
    searched += runs;
    exhaustive += static_cast<int64_t>(s.max_consumers) * (1 + 3 * s.max_producers);
    if (truth.empty()) {
      EXPECT_EQ(r->best, -1) << "trial " << trial;
      continue;
    }
    ASSERT_GE(r->best, 0) << "trial " << trial << ": brute force found " << Name(truth[0]);
    const PlanEvaluation& best = r->evaluated[static_cast<size_t>(r->best)];
    EXPECT_EQ(Name(best), Name(truth[0])) << "trial " << trial;
    EXPECT_TRUE(best.minimal && best.meets);
    if (truth.size() < 2) {
      EXPECT_EQ(r->runner_up, -1) << "trial " << trial;
      continue;
    }
    ASSERT_GE(r->runner_up, 0) << "trial " << trial << ": brute force found " << Name(truth[1]);
    EXPECT_EQ(Name(r->evaluated[static_cast<size_t>(r->runner_up)]), Name(truth[1]))
        << "trial " << trial;
  }
  // Bisection and the cost bound: well under a third of the exhaustive runs.
  EXPECT_LT(searched * 3, exhaustive) << searched << " of " << exhaustive;
}

TEST(PlanSearchTest, NothingMeetsAndNothingIsPicked) {
  PlanSpace s;
  s.policies = {RequestedMode(TransferMode::kLocal), RequestedMode(TransferMode::kScd)};
  s.max_producers = 2;
  s.max_consumers = 3;
  Capacities k;  // 3 consumers serve at most 15 of 40
  absl::StatusOr<PlanResult> r = SearchPlan(
      s, [&](const PlanCandidate& c) { return absl::StatusOr<PlanOutcome>(k.Outcome(c)); });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->best, -1);
  EXPECT_EQ(r->runner_up, -1);
  // Each consumer count tried at the most producers, which did not meet: 3 local, 3 scd.
  EXPECT_EQ(r->evaluated.size(), 6u);
}

TEST(PlanSearchTest, RefusesBadBoundsAndPassesOnTheEvaluatorsError) {
  const PlanEvaluator fine = [](const PlanCandidate&) { return absl::StatusOr<PlanOutcome>(); };
  PlanSpace s;
  s.policies = {RequestedMode(TransferMode::kScd), RequestedMode(TransferMode::kScd)};
  EXPECT_THAT(SearchPlan(s, fine).status().message(), HasSubstr("scd twice"));
  s.policies = {RequestedMode(TransferMode::kRecompute)};
  EXPECT_THAT(SearchPlan(s, fine).status().message(), HasSubstr("local, raw, scd or auto"));
  s.policies = {RequestedMode::Auto()};
  s.max_consumers = 0;
  EXPECT_FALSE(SearchPlan(s, fine).ok());
  s.max_consumers = 2;
  s.attainment = 1.5;
  EXPECT_THAT(SearchPlan(s, fine).status().message(), HasSubstr("attainment"));
  s.attainment = 0.9;
  s.producer_cost = 0;
  EXPECT_THAT(SearchPlan(s, fine).status().message(), HasSubstr("cost"));
  s.producer_cost = 1;
  const PlanEvaluator broken = [](const PlanCandidate&) -> absl::StatusOr<PlanOutcome> {
    return absl::InternalError("the simulator fell over");
  };
  EXPECT_THAT(SearchPlan(s, broken).status().message(), HasSubstr("fell over"));
}

}  // namespace
}  // namespace scd::bench
