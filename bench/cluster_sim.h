// ClusterSim: a deployment (bench/sim_config.h) under a workload on simulated time -- the
// discrete-event core of `scd-bench simulate` (issue 51). It runs the daemons' own policy code on
// one SimulatedClock (base/simulated_clock.h), not a second model of it:
//   - each coordinator is a real NodeRegistry (coordinator/node_registry.h) on the simulated
//     clock: nodes are upserted as an etcd watch would (never lapsing), their heartbeats carry
//     load, KV memory, prefix blocks and the speeds their own NodeSpeedTrackers measured from
//     their simulated work (proto/node_speeds.h); requests are routed by Resolve (route choice,
//     cache-aware routing, auto's TTFT model) and accounted by NoteRouted, NoteFirstToken,
//     RoutedDone and ObserveFinished (the link book);
//   - each consumer admits by its real Admission (consumer/admission.h: KV bytes, capacity, its
//     FIFO) and runs continuous batching by the scheduler's own plan and pacing
//     (consumer/step_plan.h PlanStep, consumer/step_pacer.h), charged the profile's costs: a
//     decode step by its sequences and context, a prompt chunk by its tokens and their context,
//     a rebuild piece by its rows, the first decode after a transfer;
//   - each producer runs up to its pool's prefill_threads passes at once, sharing its compute
//     (the profile's prefill with its context term, after what its prefix cache holds), its codes
//     leaving layer by layer as a pass has them and crossing its link (the pool pair's goodput,
//     or its trace's rate at each instant, and latency; one link per producer node, in order)
//     to the consumer, which rebuilds each layer as it arrives;
//   - prefix caches as LRU sets of blocks within their budget (a consumer's per mode);
//   - the workload's faults (bench/sim_faults.h): a frozen node computes nothing, sends no
//     heartbeat and takes calls and codes at its thaw; frozen past the keepalives, the cluster
//     answers as the daemons do (bench/sim_failover.cc): each coordinator's registry ejects it
//     (NoteUnreachable) and probes it back (TakeDueProbes, NoteProbe), its streams move to a live
//     replica (ResolveMove), its transfers fail into the consumers' own prefill, and requests
//     route local while no producer is live (the clients allow the fallback).
// Requests go to the coordinators in turn. A request's TTFT and end-to-end latency are the
// client's: the consumer's own plus its pool profile's api overhead (the call through the
// coordinator, the tokens' way back), which no node's work waits on. A node's first work after it
// sat idle is slower by its profile's [idle] slowdown, a consumer's step over or under its cost
// by its [step_noise] (draws from the workload's seed; the pacer sees them), a
// request's hop to an idle consumer by its idle overhead. Deterministic: one seed, one order of
// events. Thread-safety: RunClusterSim is reentrant (each call its own clock and state).
#ifndef SCD_BENCH_CLUSTER_SIM_H_
#define SCD_BENCH_CLUSTER_SIM_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bench/sim_config.h"
#include "codec/transfer_mode.h"

namespace scd::bench {

// One request's outcome.
struct SimRequestResult {
  uint64_t id = 0;
  double arrival_s = 0;
  int64_t prompt_tokens = 0, output_tokens = 0;
  size_t mix = 0;
  absl::StatusCode code = absl::StatusCode::kOk;  // not OK: refused (routing, admission)
  TransferMode mode = TransferMode::kLocal;       // as routed
  int moves = 0;           // its stream moved to another replica (its consumer lost)
  bool fell_back = false;  // its transfer failed (its producer lost): its consumer's own prefill
  int64_t producer_cached = 0, consumer_cached = 0;
  double ttft_s = 0, e2el_s = 0;
  std::string consumer, producer;  // node names ("fables-3"); producer "" when local
  double tpot_s() const {
    return output_tokens > 1 ? (e2el_s - ttft_s) / static_cast<double>(output_tokens - 1) : 0;
  }
};

// Seconds of work in each bin of simulated time from the run's start: a node's utilisation (or
// its link's occupancy) over time is each bin's seconds over bin_s.
struct SimTimeline {
  double bin_s = 1;
  std::vector<double> seconds;
  // Work from `from_s` (since the start) for `duration_s`, spread over the bins it covers.
  void Add(double from_s, double duration_s);
};
// The bin of a run of `duration_s`: a hundredth of it, at least 10 ms.
double SimTimelineBin(double duration_s);

// One node's work over the run.
struct SimNodeUse {
  std::string name;
  bool producer = false;
  double busy_s = 0;   // computing (producer prefills; consumer steps)
  double link_s = 0;   // producer: its link carrying codes
  int64_t steps = 0;   // consumer: batched steps
  int64_t served = 0;  // requests it finished (consumer) or prefilled (producer)
  SimTimeline busy_over_time;  // busy_s, bin by bin
  SimTimeline link_over_time;  // link_s, bin by bin (producer)
  // consumer: its step log's lines (consumer/step_log.h, every 10 simulated s), each after
  // "t=S " (simulated seconds since the start), to be read beside a real consumer's log.
  std::vector<std::string> step_log;
};

struct ClusterSimResult {
  std::vector<SimRequestResult> requests;  // in arrival order
  std::vector<SimNodeUse> nodes;
  double simulated_s = 0;  // the run's start to its last event
  double wall_s = 0;       // what it took this machine
  int64_t events = 0;
};

// Runs `workload` on `deployment` (CheckSimWorkload first: INVALID_ARGUMENT naming what does
// not fit). Requests still running `drain_s` after the last arrival are ended DEADLINE_EXCEEDED.
absl::StatusOr<ClusterSimResult> RunClusterSim(const SimDeployment& deployment,
                                               const SimWorkload& workload, double drain_s = 600);

}  // namespace scd::bench

#endif  // SCD_BENCH_CLUSTER_SIM_H_
