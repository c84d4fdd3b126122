// `scd-bench sweep --bandwidth-trace FILE`: the link's rate changing during a run, as a real
// network's does. For each mode in turn the harness replays the trace -- sets every producer's
// shaper through the coordinator's Registry.SetLinkShape at each step's time -- while it sends
// requests back to back (the prompts in turn), and records each request's start, the rate in
// force at its start and its end, its TTFT, and (auto) its choice and prediction; one
// unrecorded warm-up request per mode goes first, at the trace's first rate. The plot
// (bench/plot_trace.py) draws every mode's TTFT against time over the trace's rate.
// The trace file: bench/link_trace.h. The run lasts until the last step
// plus `hold_s`. With SweepOptions.trace_paired, auto's requests are replayed at the same
// instants of the trace with auto's choice kept at its ranks (TracePairsCsv compares the two).
// Thread-safety: RunBandwidthTrace is reentrant; one request at a time.
#ifndef SCD_BENCH_BANDWIDTH_TRACE_H_
#define SCD_BENCH_BANDWIDTH_TRACE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/bandwidth_sweep.h"
#include "bench/link_trace.h"

namespace scd::bench {

struct TraceRecord {
  std::string consumer, mode, mode_used, choice, error;
  int prompt = 0;
  bool ok = false;
  double start_s = 0, end_s = 0;  // since the trace's start (client clock)
  // The trace step in force at the start, and its rate and the one at the end: a step is in
  // force once the coordinator confirmed it (a request started before travels at the old rate).
  int step = 0;
  double gbps_start = 0, gbps_end = 0;
  double ttft_ms = 0;                   // the server's (Finished.timings.ttft)
  // The client's, from its send: everything the request set off (the producer's pass may start
  // before the consumer has the request) comes after it.
  double client_ttft_ms = 0;
  double predicted_ttft_ms = 0;         // auto's (0: none)
  uint64_t payload_bytes = 0;
  int lowered_layers = 0;  // layers the producer sent below the choice's ranks (adaptation)
  bool met_slo = false;    // ttft_ms within o.judge_ttft_ms, else o.ttft_slo_ms (false: none)
  double expected_kl = 0;  // the frontier's KL of the point sent (Started.expected_kl; 0: none)
  // auto-kept-replay: the index (in the returned records) of auto's request it replays.
  int replay_of = -1;
};

// The mode of a paired replay's records.
inline constexpr char kKeptReplayMode[] = "auto-kept-replay";

// Uses o.server, o.control, o.secret, o.consumers, o.modes, o.prompts, o.max_tokens (and auto's
// max_kl / ttft_slo_ms); the link is left unshaped at the end. INVALID_ARGUMENT: an empty trace,
// no modes, consumers or prompts, hold_s < 0.
absl::StatusOr<std::vector<TraceRecord>> RunBandwidthTrace(const SweepOptions& o,
                                                          const std::vector<TraceStep>& trace,
                                                          double hold_s);

std::string TraceJsonl(const std::vector<TraceRecord>& records);
// The paired replay against auto's pass, per consumer, with a header: pairs (both ended), those
// where auto sent a point and where the replay sent the same one, requests within the TTFT
// objective adapted / kept over all pairs and over the point pairs, point pairs with lowered
// layers, and the point pairs' median TTFT and bytes each way. Empty (header only) without a
// replay.
std::string TracePairsCsv(const std::vector<TraceRecord>& records);
// Per (consumer, mode, trace step): requests started while it was in force, failures, median TTFT,
// median predicted TTFT, requests within the TTFT SLO and with lowered layers, the choices made;
// with a header.
std::string TraceSummaryCsv(const std::vector<TraceRecord>& records,
                            const std::vector<TraceStep>& trace);

}  // namespace scd::bench

#endif  // SCD_BENCH_BANDWIDTH_TRACE_H_
