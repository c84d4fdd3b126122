// NodeProfile: one node type's measured costs, what the cluster simulator (issue 51) charges a
// simulated node of that type for each piece of work. Measured from real daemons by
// `scd-bench profile` (the costs they already report, registry.proto NodeSpeeds, and the
// scheduler's steps) and kept as a TOML file per node type:
//   [node]         role ("producer" | "consumer"), model, machine (where it was measured),
//                  cpu_quota (the CPUs it had; 0: not limited)
//   [prefill]      a prompt pass over n computed tokens after c cached ones (a producer's with
//                  its encoding, a consumer's own local prefill up to its first token):
//                  fixed_us + per_token_us * n + per_token_context_us * (n * c + n * (n + 1) / 2)
//                  -- the last term the attention over each position's context
//   [encode]       producer: codes of n tokens, fixed_us + per_token_us * n
//   [rebuild]      consumer: n tokens' cache from codes, fixed_us + per_token_us * n
//   [first_decode] consumer: the first step after a transfer of n prompt tokens, same form
//   [decode_step]  consumer: one step of b sequences holding t context tokens in all,
//                  fixed_us + per_sequence_us * b + per_context_token_us * t
//   [interference] consumer: local_itl_us, rebuild_itl_us (what each prompt token of a local
//                  prefill or a rebuild delays the sequences decoding beside it) and
//                  busy_prefill_us (a local prefill's time per token beside decodes)
//   [api]          consumer: overhead_us, what a client's TTFT holds beyond the consumer's own
//                  (Timings.ttft): the call through the coordinator to the consumer and the first
//                  token's way back (the median, one request at a time; optional, default 0)
//   [idle]         both, optional: what work costs on a node that sat idle (measured here: a
//                  prompt after 240 ms of nothing took 1.15-1.6x its cost on a busy node, the
//                  front end's hop 1.5 ms more; after 55 ms a few percent -- the CPU and the
//                  threads woken): after_us (the idle the measured work followed; 0: not
//                  measured, no slowdown), slowdown_p50 and slowdown_p90 (that work's time over
//                  its busy cost, >= 1), and the consumer's api_overhead_us (the front end's hop
//                  for a request arriving to an idle deployment)
//   [step_noise]   consumer, optional: a decode step's time over the mean of its shape's, as
//                  quantiles p10, p50, p90, p99 (from the gaps between a stream's tokens, tokens
//                  delivered together split evenly): what makes the scheduler's pacer trim its
//                  chunks where steps overrun; all 0: not measured, steps take their cost
//   [memory]       consumer: kv_bytes_per_token, kv_budget_bytes, capacity (requests at once),
//                  step_rows (prompt rows one step carries)
//   [link]         producer: goodput_gbps and latency_us of its link to the consumers
// Bounded like every file the project parses: at most kMaxProfileBytes; numbers finite, >= 0
// and at most kMaxProfileValue; strings at most 256 printable bytes; an unknown table or key is
// an error naming it (a typo is not a default). Every cost of the node's role must be there.
// Thread-safety: values and stateless functions.
#ifndef SCD_BENCH_NODE_PROFILE_H_
#define SCD_BENCH_NODE_PROFILE_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace scd::bench {

constexpr size_t kMaxProfileBytes = 64 << 10;
constexpr double kMaxProfileValue = 1e15;  // bench/bounded_toml.h kMaxTomlNumber

enum class NodeRole { kProducer, kConsumer };
const char* NodeRoleName(NodeRole role);

// fixed_us + per_token_us * n.
struct LineCost {
  double fixed_us = 0;
  double per_token_us = 0;
  double At(double n) const { return fixed_us + per_token_us * n; }
};

struct PrefillCost {
  double fixed_us = 0;
  double per_token_us = 0;
  double per_token_context_us = 0;
  // The pass over `tokens` computed tokens after `cached` ones.
  double At(int64_t tokens, int64_t cached) const;
};

struct StepCost {
  double fixed_us = 0;
  double per_sequence_us = 0;
  double per_context_token_us = 0;
  double At(int64_t sequences, int64_t context_tokens) const {
    return fixed_us + per_sequence_us * static_cast<double>(sequences) +
           per_context_token_us * static_cast<double>(context_tokens);
  }
};

// The slowdown of a node's first work after it sat idle (the [idle] table).
struct IdleCost {
  double after_us = 0;  // the idle the measured work followed; 0: not measured
  double slowdown_p50 = 1, slowdown_p90 = 1;
  double api_overhead_us = 0;  // consumer: the front end's hop after idle; 0: not measured
  // How much of the measured slowdown work after `idle_us` of idle has: idle_us / after_us, up to
  // 1 (a linear guess between the two idles measured: 55 ms added a few percent, 240 ms all).
  double Share(double idle_us) const;
  // The factor on the work's time after `idle_us` of idle, for a standard normal draw `z`: the
  // slowdown a lognormal through p50 and p90 gives, scaled by Share; at least 1.
  double Factor(double idle_us, double z) const;
};

// The spread of a step's time around its cost (the [step_noise] table).
struct StepNoise {
  double p10 = 0, p50 = 0, p90 = 0, p99 = 0;  // all 0: not measured
  bool measured() const { return p99 > 0; }
  // The factor on a step's cost for a uniform draw `u` in [0, 1): the quantile function
  // through the four (flat below p10 and above p99, linear between), over its mean, so that the
  // factors' mean is 1 and the cost stays the mean step. 1 when not measured.
  double Factor(double u) const;
};

struct NodeProfile {
  NodeRole role = NodeRole::kConsumer;
  std::string model;
  std::string machine;
  double cpu_quota = 0;
  PrefillCost prefill;
  LineCost encode;                                                   // producer
  LineCost rebuild;                                                  // consumer
  LineCost first_decode;                                             // consumer
  StepCost decode_step;                                              // consumer
  double local_itl_us = 0, rebuild_itl_us = 0, busy_prefill_us = 0;  // consumer, per token
  double api_overhead_us = 0;                                        // consumer, per request
  IdleCost idle;
  StepNoise step_noise;                                              // consumer
  int64_t kv_bytes_per_token = 0, kv_budget_bytes = 0;               // consumer
  int64_t capacity = 0, step_rows = 0;                               // consumer
  double link_goodput_gbps = 0, link_latency_us = 0;                 // producer

  // The link's time for `bytes`: latency plus the bytes at its goodput.
  double LinkUs(int64_t bytes) const;
};

// The profile in `toml` (INVALID_ARGUMENT naming what is wrong).
absl::StatusOr<NodeProfile> ParseNodeProfile(std::string_view toml);
// The profile in the file at `path` (NotFound, or INVALID_ARGUMENT naming the path).
absl::StatusOr<NodeProfile> ReadNodeProfile(const std::string& path);
// The profile as TOML, each number exact (ParseNodeProfile reads the same profile back), the
// tables of its role only, each with a comment of its form.
std::string NodeProfileToml(const NodeProfile& profile);
// Whether the profile holds what its role needs (INVALID_ARGUMENT naming the first cost missing
// or out of bounds): what ParseNodeProfile checks, for profiles made in code.
absl::Status CheckNodeProfile(const NodeProfile& profile);

}  // namespace scd::bench

#endif  // SCD_BENCH_NODE_PROFILE_H_
