// `scd-bench plan` (issue 51): for a model pair, SLOs, a link speed and a traffic description,
// the cheapest deployment that meets the SLOs at the asked attainment, searched in the cluster
// simulator (bench/plan_search.h over bench/cluster_sim.h).
//
// The deployment file is the template: one producer pool and one consumer pool taking its codes
// (their profiles, caches, the pair's codes, the link), whose counts the search sets; the
// workload file is the traffic and its SLOs, whose every request asks the policy searched (local,
// scd or auto; raw on asking, for a consumer with the producer's weights) -- a local candidate
// has no producer pool. Each candidate runs the workload
// for `seeds` seeds (its own and the next ones); its attainment is the worst seed's share of
// requests meeting both SLOs, its goodput the seeds' mean. Writes DIR/plan.json (every candidate
// run, the plan and its runner-up), DIR/plan.md (the same as a table) and DIR/deployment.toml
// (the plan's deployment, its profiles' paths relative to DIR, the policy in its header). A
// search where nothing meets writes them too and ends NOT_FOUND naming the nearest candidate.
// Thread-safety: call from main.
#ifndef SCD_BENCH_PLAN_COMMAND_H_
#define SCD_BENCH_PLAN_COMMAND_H_

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bench/plan_search.h"
#include "bench/sim_config.h"

namespace scd::bench {

struct PlanFlags {
  std::string deployment, workload, out;
  // Raw is not searched unless asked: it sends the producer's own KV cache, faithful only where
  // the consumer has the producer's weights, and the simulator's pairs (a base and a fine-tuned
  // or independently trained model) have different ones -- the coordinator would serve it
  // degraded (refused with --strict-modes).
  std::string policies = "local,scd,auto";
  int64_t max_producers = 4, max_consumers = 8;
  double producer_cost = 1, consumer_cost = 1;
  double attainment = 0.9;
  int64_t seeds = 2;
  double link_gbps = 0;                       // > 0: every pair's link at this goodput
  double link_latency_us = -1;                // >= 0: and this latency
  double ttft_slo_ms = -1, tpot_slo_ms = -1;  // >= 0: instead of the workload's (0: none)
  double drain_s = 60;  // what still runs this long after the last arrival is ended (missed)
  bool progress = true;
};

// The template with `candidate`'s counts (no producer pool for local) and, where `link_gbps` >
// 0, every pair's link at that goodput (and `link_latency_us` where >= 0). INVALID_ARGUMENT for a
// template that is not one producer pool and one consumer pool taking its codes.
absl::StatusOr<SimDeployment> PlanDeployment(const SimDeployment& tmpl,
                                             const PlanCandidate& candidate, double link_gbps = 0,
                                             double link_latency_us = -1);
// The workload with every request asking `policy`.
SimWorkload PlanWorkload(const SimWorkload& workload, RequestedMode policy);
// `workload` on `deployment` for `seeds` seeds from its own (the header's figures).
absl::StatusOr<PlanOutcome> EvaluatePlan(const SimDeployment& deployment,
                                         const SimWorkload& workload, int64_t seeds,
                                         double drain_s);

CLI::App* AddPlanCommand(CLI::App& app, PlanFlags* flags);
absl::Status RunPlanCommand(const PlanFlags& flags);

}  // namespace scd::bench

#endif  // SCD_BENCH_PLAN_COMMAND_H_
