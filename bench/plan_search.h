// PlanSearch: `scd-bench plan`'s search (issue 51) -- the cheapest deployment of one model pair
// that meets a workload's SLOs at an asked attainment, found by running candidates through an
// evaluator (the cluster simulator, bench/plan_command.h; tests give analytic ones).
//
// A candidate is a mode policy (the mode every request asks for: local, raw, scd or auto) with a
// count of producers (0 for local) and of consumers; its cost is producers * producer_cost +
// consumers * consumer_cost. It meets when its attainment (the share of requests meeting both
// SLOs, the worst over the evaluator's seeds) is at least the asked one. The search assumes a
// node more of either kind never turns a candidate that meets into one that does not (the
// simulator's runs are not exactly monotone -- a node more changes routing -- which is why the
// plan's answer is checked against brute force, tests/plan_command_test.cc): per policy and
// consumer count it bisects for the fewest producers that meet, never more than the previous
// count needed, and stops counting consumers once a count costs more than the two best found.
// Each (policy, consumers, fewest producers) that meets and needs fewer producers than one
// consumer less did is a *minimal* deployment; the best of them (BetterPlan) is the plan, the
// next the runner-up.
// Thread-safety: SearchPlan is reentrant; it calls `evaluate` from its own thread, in order.
#ifndef SCD_BENCH_PLAN_SEARCH_H_
#define SCD_BENCH_PLAN_SEARCH_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "codec/transfer_mode.h"

namespace scd::bench {

struct PlanCandidate {
  RequestedMode policy;
  int64_t producers = 0, consumers = 0;
};

// What a candidate's runs gave.
struct PlanOutcome {
  double attainment = 0;  // the share of requests meeting the SLOs, the worst over seeds
  double goodput = 0;     // requests meeting the SLOs per second of workload, the seeds' mean
  double ttft_p90_ms = 0, tpot_p90_ms = 0;  // the seeds' mean (reported, not judged)
  double codes_share = 0;                   // of the requests that finished: ran raw or scd
};

struct PlanSpace {
  std::vector<RequestedMode> policies;           // searched in this order (ties go to the earlier)
  int64_t max_producers = 4, max_consumers = 8;  // >= 1
  double producer_cost = 1, consumer_cost = 1;   // > 0: a node's price
  double attainment = 0.9;                       // in (0, 1]
};

struct PlanEvaluation {
  PlanCandidate candidate;
  PlanOutcome outcome;
  double cost = 0;
  bool meets = false;
  bool minimal = false;  // a minimal deployment (above): what the plan chooses from
  int64_t nodes() const { return candidate.producers + candidate.consumers; }
  double goodput_per_node() const;
};

struct PlanResult {
  std::vector<PlanEvaluation> evaluated;  // in the order they ran
  int best = -1, runner_up = -1;          // into `evaluated`; -1: none (met)
};

using PlanEvaluator = std::function<absl::StatusOr<PlanOutcome>(const PlanCandidate&)>;

// Whether `a` is the better plan of two that meet: the cheaper; at equal cost the more goodput
// per node; then the higher attainment; then the fewer nodes.
bool BetterPlan(const PlanEvaluation& a, const PlanEvaluation& b);

// INVALID_ARGUMENT naming a bound out of range or a policy twice; an evaluator's error as it is.
absl::StatusOr<PlanResult> SearchPlan(const PlanSpace& space, const PlanEvaluator& evaluate);

}  // namespace scd::bench

#endif  // SCD_BENCH_PLAN_SEARCH_H_
