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
  bool per_request = false;  // per_stream in the JSON
};

// The run's summary as JSON: the same for a seed in any process (no wall-clock figures: those go
// to stderr, with the cost per event). `per_request`: also `per_stream`, each request's figures
// as arrays in arrival order (`scd-bench serve`'s names: ttft_ms, e2el_ms, input_len, output_len,
// mode, code, target, producer_cached_tokens, consumer_cached_tokens; and arrival_s) -- a line of
// the JSON per request, for runs small enough to read (a validation's) -- and each consumer's
// `step_log`, the lines its daemon would log (consumer/step_log.h).
std::string SimulateJson(const ClusterSimResult& result, const SimWorkload& workload,
                         bool per_request = false);

CLI::App* AddSimulateCommand(CLI::App& app, SimulateFlags* flags);
absl::Status RunSimulateCommand(const SimulateFlags& flags);

}  // namespace scd::bench

#endif  // SCD_BENCH_SIMULATE_COMMAND_H_
