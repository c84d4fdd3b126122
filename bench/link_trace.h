// A bandwidth trace: a link's rate changing over time, as a real network's does -- read by
// `scd-bench sweep --bandwidth-trace` (bench/bandwidth_trace.h: replayed on real links) and by the
// cluster simulator's `[[link]] trace` (bench/sim_config.h: on simulated ones).
// File: one step per line, "SECONDS GBPS" (time from the start; GBPS a rate > 0 or inf:
// unshaped), ascending, the first at 0; '#' starts a comment; after the last step its rate holds.
// Thread-safety: stateless functions.
#ifndef SCD_BENCH_LINK_TRACE_H_
#define SCD_BENCH_LINK_TRACE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace scd::bench {

struct TraceStep {
  double at_s = 0;
  double gbps = 0;  // inf: unshaped
};

// INVALID_ARGUMENT naming the line: not two numbers, a rate <= 0, times not ascending from 0.
absl::StatusOr<std::vector<TraceStep>> ParseBandwidthTrace(const std::string& text);
// The rate in force `t` seconds into the trace.
double RateAt(const std::vector<TraceStep>& trace, double t);
// Seconds `bytes` take to cross a link that follows `trace` from `start_s` on: each step carries
// at its rate for as long as it is in force (0 where the rate is inf).
double TraceSendSeconds(const std::vector<TraceStep>& trace, double start_s, double bytes);

}  // namespace scd::bench

#endif  // SCD_BENCH_LINK_TRACE_H_
