// ProfileFit: a producer's and a consumer's NodeProfile (bench/node_profile.h) from what real
// requests measured -- the pure half of `scd-bench profile` (bench/profile_command.h), which runs
// the requests. Each cost is a FitNonNegative (bench/cost_fit.h) of its form over the requests
// that show it:
//   producer prefill (its pass with the encoding, Timings.prefill) over n computed positions
//     after c cached ones (the prompt's prefix: every token but the last, which the consumer
//     decodes), encode (Timings.encode) over n, and its link: what the last layer's codes took
//     to arrive after the pass had them out (layer_codes[0] + transfer - layer_codes[last],
//     the part layer-wise streaming cannot hide) over that layer's bytes;
//   consumer local prefill (Timings.prefill in local mode) over its n computed tokens after c
//     cached ones, rebuild (Timings.rebuild) over the n positions it received, the first decode
//     after a transfer over the prompt, and a decode step over the sequences it advances and
//     the context they hold (from the gaps between tokens of requests decoding together);
//   each node's idle slowdown (NodeProfile.idle): prompts sent after the deployment sat idle,
//     each prefill over the busy median of its shape (the producer's from scd prompts, the
//     consumer's from local ones), and the front end's hop they saw.
// Thread-safety: stateless functions.
#ifndef SCD_BENCH_PROFILE_FIT_H_
#define SCD_BENCH_PROFILE_FIT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/cost_fit.h"
#include "bench/node_profile.h"

namespace scd::bench {

// One finished request's account (the server's Finished event), microseconds.
struct PromptSample {
  bool local = false;  // the consumer prefilled itself; otherwise codes came from the producer
  int64_t prompt_tokens = 0;
  int64_t producer_cached = 0, consumer_cached = 0;
  double prefill_us = 0, encode_us = 0, rebuild_us = 0, first_decode_us = 0, transfer_us = 0;
  int64_t payload_bytes = 0;
  int layers = 0;                                        // layers the codes came in
  double first_layer_out_us = 0, last_layer_out_us = 0;  // Timings.layer_codes, front and back
  // The client's TTFT (request sent -> first token received) and the consumer's own
  // (Timings.ttft: request received -> first token sent); 0 when not measured.
  double client_ttft_us = 0, server_ttft_us = 0;
  // How long the deployment had nothing to do before this request was sent; 0: it was sent as
  // the one before it ended (busy), which is what the cost fits take.
  double idle_us = 0;
};

// One decode step of `sequences` sequences holding `context_tokens` in all, and its time.
struct StepSample {
  int64_t sequences = 0, context_tokens = 0;
  double step_us = 0;
};

// The decode step of requests that decoded together, each of `prompt_tokens` prompt tokens,
// from the gaps between their tokens (gaps[s][j]: stream s's gap between tokens j and j + 1,
// seconds): the mean gap over the later half of the gaps every stream has (by then every prompt
// is in, so the steps carry decodes only; the mean, as the node's throughput sees it, through
// delivery jitter and quota stalls alike), at the context the sequences held at that half's
// middle: streams * (prompt + j + 1). sequences 0 when there are fewer than 2 gaps.
StepSample StepFromGaps(const std::vector<std::vector<double>>& gaps, int64_t prompt_tokens);

// Each step's time over the mean step, from the same gaps and half as StepFromGaps: a gap under
// half its stream's median is a token delivered with the one before (the stream, not the step,
// was late), so the two gaps are taken as two steps of their mean. Empty when StepFromGaps finds
// no step.
std::vector<double> StepRatios(const std::vector<std::vector<double>>& gaps);

// What a fit made of its samples: the costs' names and their fit (for the report).
struct FitReport {
  std::string cost;  // "producer.prefill", "consumer.decode_step", ...
  int samples = 0;
  CostFit fit;
};

struct ProfileFitInput {
  std::vector<PromptSample> prompts;  // busy ones (idle_us 0) fit the costs; idle ones the slowdown
  std::vector<StepSample> steps;
  std::vector<double> step_ratios;  // StepRatios of every step sample; 20 at least for a noise
  std::string producer_model, consumer_model, machine;
  double producer_cpus = 0, consumer_cpus = 0;
  // What the consumer reports of itself (control.proto NodeStats), taken as measured.
  double local_itl_us = 0, rebuild_itl_us = 0, busy_prefill_us = 0;
  int64_t kv_bytes_per_token = 0, kv_budget_bytes = 0, capacity = 0, step_rows = 0;
};

struct ProfileFitResult {
  NodeProfile producer, consumer;
  std::vector<FitReport> fits;
};

// The slowdown of `local` (the consumer's) or remote (the producer's) prompts sent after idle:
// each one's prefill over the median of the busy samples of its shape, their median and 90th
// percentile (at least 1), after the median idle; the api overhead the median hop of every idle
// sample. IdleCost{} when there is no idle sample with a busy shape to compare to.
IdleCost FitIdle(const ProfileFitInput& input, bool local);

// The samples taken as one per shape: for each prompt shape (mode, prompt tokens, each side's
// cached tokens; busy samples only) a sample whose every cost is the median of that shape's samples
// (repeats and runs alike), for each step shape (sequences, context tokens) the median step, in the
// order the shapes first appear. A pass that stalled at a quota's period, or ran beside a stray
// process, is then one sample among its shape's, not a pull on the least-squares fit.
ProfileFitInput MedianByShape(const ProfileFitInput& in);

// The two profiles, fitted to MedianByShape(input) (the api overhead: the median over every
// prompt sample). INVALID_ARGUMENT naming the cost whose samples are too few or cannot be
// fitted, or when a profile made is not valid (CheckNodeProfile).
absl::StatusOr<ProfileFitResult> FitProfiles(const ProfileFitInput& input);

}  // namespace scd::bench

#endif  // SCD_BENCH_PROFILE_FIT_H_
