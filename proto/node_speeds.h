// NodeSpeedTracker: a node's moving estimates of its own speeds (registry.proto NodeSpeeds),
// from the work it completed, reported with every heartbeat so the coordinator's auto mode can
// predict each choice's time to first token (coordinator/auto_choice.h).
//   producer: ObservePrefill for each prefill (computed tokens, its time with the encoding);
//   consumer: ObserveFinished for each Finished it writes: a local prefill's time up to the first
//             token (timings.ttft - timings.queue) against the tokens it computed (prompt - its
//             cache's); an scd transfer's rebuild (rebuild + patch) against the tokens sent, and
//             its first decode step against the prompt tokens.
// Each is a least-squares line over the last `window` observations (base/cost_estimate.h).
// Thread-safety: thread-safe.
#ifndef SCD_PROTO_NODE_SPEEDS_H_
#define SCD_PROTO_NODE_SPEEDS_H_

#include <cstddef>
#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "base/cost_estimate.h"
#include "scd/v1/inference.pb.h"
#include "scd/v1/registry.pb.h"

namespace scd {

class NodeSpeedTracker {
 public:
  explicit NodeSpeedTracker(size_t window = 32)
      : prefill_(window), rebuild_(window), first_decode_(window) {}

  void ObservePrefill(int64_t computed_tokens, double us);
  void ObserveFinished(const v1::Finished& finished);
  v1::NodeSpeeds Report() const;

 private:
  mutable absl::Mutex mu_;
  CostEstimate prefill_ ABSL_GUARDED_BY(mu_);
  CostEstimate rebuild_ ABSL_GUARDED_BY(mu_);
  CostEstimate first_decode_ ABSL_GUARDED_BY(mu_);
};

// The proto form of an estimate (a fitted line of `samples` observations).
void ToProto(const CostEstimate& estimate, v1::LinearCost* out);
// fixed_us + per_unit_us * n (0 when nothing was measured).
double CostAt(const v1::LinearCost& cost, double n);
// A consumer's per-token cost (registry.proto NodeSpeeds.local_itl / rebuild_itl /
// busy_prefill) of `us_per_token`, left unset when it is 0 (not measured).
void SetPerTokenCost(double us_per_token, v1::LinearCost* out);
// `speeds` as a node reported them, each cost kept only when both terms are finite and >= 0
// (else as not measured): what predictions may read. A report is a peer's word.
v1::NodeSpeeds CheckedSpeeds(const v1::NodeSpeeds& speeds);

}  // namespace scd

#endif  // SCD_PROTO_NODE_SPEEDS_H_
