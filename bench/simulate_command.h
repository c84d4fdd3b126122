// `scd-bench simulate`: a deployment under a workload on simulated time (bench/cluster_sim.h),
// reported as `scd-bench serve` reports a real run -- TTFT, TPOT and end-to-end latency
// summaries (bench/serve_benchmark.h Summarize), goodput under the workload's SLOs, the modes
// routing chose, failures by code -- plus each node's utilisation and link occupancy, the
// events run; what they cost this machine on stderr. The JSON is the same for a seed in any
// process.
// Thread-safety: call from main.
#ifndef SCD_BENCH_SIMULATE_COMMAND_H_
#define SCD_BENCH_SIMULATE_COMMAND_H_

#include <CLI/CLI.hpp>
#include <string>

#include "absl/status/status.h"
#include "bench/cluster_sim.h"

namespace scd::bench {

struct SimulateFlags {
  std::string deployment, workload, out;
  double drain_s = 600;
  int64_t seed = -1;  // >= 0: overrides the workload's
};

// The run's summary as JSON: the same for a seed in any process (no wall-clock figures: those go
// to stderr, with the cost per event).
std::string SimulateJson(const ClusterSimResult& result, const SimWorkload& workload);

CLI::App* AddSimulateCommand(CLI::App& app, SimulateFlags* flags);
absl::Status RunSimulateCommand(const SimulateFlags& flags);

}  // namespace scd::bench

#endif  // SCD_BENCH_SIMULATE_COMMAND_H_
