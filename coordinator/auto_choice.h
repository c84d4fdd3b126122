// Auto mode's choice for one target: local prefill, or one of the ways to send the prompt's cache
// (a frontier point of the pair's artifact, or a raw cache between identical weights), whichever
// the TTFT model (codec/ttft_model.h) predicts reaches the first token soonest within the
// request's quality budget, from what was measured:
//   - the prompt's tokens left after each node's prefix cache (routing's view of the caches);
//   - each node's speeds as its heartbeats report them (registry.proto NodeSpeeds): the
//     producer's prefill, the consumer's own prefill, rebuild and first decode step. A prefill
//     speed one node has not measured yet is taken as the other's (same architecture);
//   - the nodes' queues: requests ahead of this one on the computing node, each as long as this
//     one's pass (a CPU runs them one after another);
//   - the link: the shape the coordinator set or the codes travelled under, else the goodput
//     measured from transfers the link held back (LinkEstimate), else unlimited;
//   - the consumer's running batch: the sequences decoding there wait for the prompt work a
//     choice puts on the consumer (its local prefill's chunks, a transfer's rebuild), by the ITL
//     cost per prompt token it measured for each (NodeSpeeds.local_itl / rebuild_itl): a
//     choice's cost is its predicted TTFT plus that delay summed over the decoding sequences
//     (the total latency the choice adds), so a local prefill that is a little faster for this
//     request but stalls a busy batch loses to codes the consumer rebuilds cheaply; and a local
//     prefill beside decoding sequences takes at least its tokens times the time per token the
//     consumer measured for prefills beside decodes (NodeSpeeds.busy_prefill: it advances only
//     in their steps' slack);
//   - the candidate's bytes per token (the frontier's measurement; raw: the consumer's 16-bit KV
//     bytes per token) and its rebuild: the consumer's measured rebuild speed, else the
//     frontier's fit-time cost; the last chunk's share 1 / layers of it.
// With a TTFT objective (ttft_slo_ms) the choice is instead the best quality (lowest KL) whose
// prediction meets it, the fastest when none does. Every choice names the runner-up and its
// prediction, for Finished.mode_reason.
// Thread-safety: pure functions, and LinkEstimate is not thread-safe (its owner locks).
#ifndef SCD_COORDINATOR_AUTO_CHOICE_H_
#define SCD_COORDINATOR_AUTO_CHOICE_H_

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "base/cost_estimate.h"
#include "codec/frontier.h"
#include "codec/transfer_mode.h"
#include "codec/ttft_model.h"
#include "scd/v1/inference.pb.h"
#include "scd/v1/registry.pb.h"

namespace scd::coordinator {

// The link between a producer and a consumer, as its transfers showed it. A transfer the link
// held back (transfer time over 1.25x the producer's prefill: layer-wise streaming otherwise
// finishes with the prefill) is a sample of bytes against time (fixed = latency, per byte =
// 1 / goodput). One that finished faster than the estimate allows (under 0.8x its prediction)
// proves the link got faster: the samples are dropped. Samples older than `max_age` are
// forgotten (a link auto stopped using is measured afresh).
class LinkEstimate {
 public:
  explicit LinkEstimate(absl::Duration max_age = absl::Seconds(60)) : max_age_(max_age) {}
  void Observe(const v1::Finished& finished, absl::Time now);
  // Goodput in bytes/s and latency in us (false: nothing measured lately).
  bool Known(absl::Time now) const;
  double goodput_bytes_per_s() const;
  double latency_us() const { return samples_.fixed(); }

 private:
  absl::Duration max_age_;
  CostEstimate samples_{16};
  absl::Time last_ = absl::InfinitePast();
};

// What auto knows of one request on one (producer, consumer) pair.
struct AutoInputs {
  double prompt_tokens = 0;
  double consumer_cached_tokens = 0, producer_cached_tokens = 0;
  v1::NodeSpeeds consumer, producer;
  double consumer_queue = 0, producer_queue = 0;  // requests ahead on each
  double consumer_decoding = 0;                   // sequences decoding on the consumer
  double goodput_bytes_per_s = 0;                 // 0: unlimited
  double latency_us = 0;
  std::string link;  // how the link is known, for reasons: "0.1 Gbit/s as set", "measured 3 MB/s"
  int layers = 1;    // layers the codes cover (the last chunk's share of the rebuild)
};

// The prefill speed of `own`, else `other`'s (same architecture: one that has measured none).
const v1::LinearCost& PrefillOf(const v1::NodeSpeeds& own, const v1::NodeSpeeds& other);

// Whether a prediction is possible: some prefill speed measured (either node's).
bool CanPredict(const AutoInputs& in);
TtftPrediction PredictLocal(const AutoInputs& in);
// A transfer of `bytes_per_token` per sent token; `rebuild_us_per_token` the fit-time cost
// (used only when the consumer measured none; raw: 0).
TtftPrediction PredictTransfer(const AutoInputs& in, double bytes_per_token,
                               double rebuild_us_per_token, bool rebuilds);

struct AutoCandidate {
  TransferMode mode = TransferMode::kLocal;  // local, raw or scd
  std::optional<FrontierPoint> point;  // scd: the frontier point sent
  double kl = 0;                       // as the frontier measured it (local, raw: 0)
  TtftPrediction predicted;
  // Inter-token latency its prompt work on the consumer adds, summed over the sequences decoding
  // there (microseconds; 0 when none decode or the cost is not measured).
  double batch_us = 0;
  double cost_us() const { return predicted.total_us + batch_us; }
  std::string label;  // for reasons: "local prefill", "raw", "point #3 int4 K .. (KL ..)"
};

// "#3 int4 K 6,12 V 10,15 H 32,48 (KL 0.0181, 157.5 B/token)".
std::string PointText(const Frontier& frontier, const FrontierPoint& p);

// Local prefill first, then every point of `frontier`, or with no frontier (identical weights)
// the raw cache at `raw_bytes_per_token`; each with its prediction.
std::vector<AutoCandidate> AutoCandidates(const AutoInputs& in, const Frontier* frontier,
                                          double raw_bytes_per_token);

struct AutoChoice {
  size_t chosen = 0;
  std::optional<size_t> runner_up;
  std::string reason;
};

// The ITL a consumer's running batch loses to `tokens` prompt tokens of work costing
// `itl` per token (NodeSpeeds.local_itl / rebuild_itl), summed over its decoding sequences.
double BatchDelayUs(const AutoInputs& in, const v1::LinearCost& itl, double tokens);

// Chooses among `candidates` (at least one; local among them, KL 0): within `max_kl` (<= 0: no
// budget), the cheapest (cost_us: predicted TTFT and the batch's delay), or with `slo_us` > 0
// the lowest KL predicted to meet it (its own TTFT; the cheapest among equals).
// `budget` names the budget in the reason ("max_kl 0.02", "the recommended point's KL 0.019").
// `incumbent`: what auto chooses without a cost model (the recommended point, the raw cache);
// without an objective it stands unless another is predicted faster by 1 ms and 5 %.
AutoChoice ChooseAuto(const std::vector<AutoCandidate>& candidates, double max_kl,
                      const std::string& budget, double slo_us,
                      std::optional<size_t> incumbent = std::nullopt);

// By when (microseconds from the request's start) a chosen transfer's last byte should arrive:
// the point then travels adapted, later layers at lower ranks when the link falls behind
// (codec/rank_governor.h). With `slo_us` > 0 the objective less what follows the last byte
// (the last rebuild and the first decode, as predicted; at least 1 us); else the predicted
// delivery with 25 % and 2 ms of slack, so only a link slower than predicted lowers anything.
double DeliverByUs(const TtftPrediction& predicted, double slo_us);

}  // namespace scd::coordinator

#endif  // SCD_COORDINATOR_AUTO_CHOICE_H_
