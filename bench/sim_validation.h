// The cluster simulator checked against real runs (issue 51): one workload (bench/sim_config.h)
// replayed for real -- the same requests SimRequests draws for its seed, each a prompt of token
// ids whose shared-prefix blocks are the same ids for every request of its tenant's group and
// whose other ids are its own, sent at its arrival time with its mode, output length and tenant
// (bench/serve_benchmark.h's trace) -- and the figures both runs are judged by: goodput under
// the workload's SLOs per second of its duration, TTFT and TPOT at p50 and p90, the modes run;
// and the comparison's relative errors against the acceptance's bounds.
// Thread-safety: values and stateless functions.
#ifndef SCD_BENCH_SIM_VALIDATION_H_
#define SCD_BENCH_SIM_VALIDATION_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/cluster_sim.h"
#include "bench/serve_benchmark.h"
#include "bench/sim_config.h"
#include "bench/sim_requests.h"

namespace scd::bench {

// The requests as a trace for RunServeBenchmark: prompts (ids in [first_id, vocab_size)), their
// send times, and the one consumer pool they target. INVALID_ARGUMENT when the mix targets more
// than one pool (a replay sends every request to one target) or the vocabulary is too small.
struct SimReplay {
  std::string target;
  std::vector<BenchPrompt> prompts;
  std::vector<double> arrivals_s;
};
absl::StatusOr<SimReplay> ReplayOf(const std::vector<SimRequest>& requests,
                                   const SimWorkload& workload, int vocab_size, int first_id = 3);

// What a run is judged by. Goodput counts requests meeting every SLO of the workload per second
// of its duration (the offered window, the same for both runs); latencies in milliseconds over
// the requests that finished.
struct RunFigures {
  int64_t requests = 0, completed = 0, good = 0;
  double goodput = 0;
  double ttft_p50_ms = 0, ttft_p90_ms = 0, tpot_p50_ms = 0, tpot_p90_ms = 0;
  std::map<std::string, int64_t> modes;  // the modes the finished requests ran
};
RunFigures FiguresOf(const ServeBenchResult& real, const SimWorkload& workload);
RunFigures FiguresOf(const ClusterSimResult& simulated, const SimWorkload& workload);

// The judged figures by name, in the order CompareFigures and SpreadOf report them: goodput,
// ttft_p50, ttft_p90, tpot_p50, tpot_p90.
std::vector<std::pair<std::string, double>> FigureValues(const RunFigures& f);

// The acceptance's bounds: goodput within 10 %, TTFT and TPOT p50 and p90 within 15 %.
inline constexpr double kGoodputBound = 0.10, kLatencyBound = 0.15;

// |simulated - real| / real per figure ("goodput", "ttft_p50", ...; 0 when both are 0, 1 when
// only real is 0), and whether each is within its bound.
struct FigureError {
  std::string figure;
  double real = 0, simulated = 0, error = 0, bound = 0;
  bool within() const { return error <= bound; }
};
std::vector<FigureError> CompareFigures(const RunFigures& real, const RunFigures& simulated);

// Mean and sample standard deviation of each figure over simulated runs (other seeds).
struct FigureSpread {
  std::string figure;
  double mean = 0, std = 0;
};
std::vector<FigureSpread> SpreadOf(const std::vector<RunFigures>& runs);

}  // namespace scd::bench

#endif  // SCD_BENCH_SIM_VALIDATION_H_
