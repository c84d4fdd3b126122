// StepPacer: how much prompt work a decode step may carry beside its decodes (continuous
// batching's pacing, consumer/decode_scheduler.h). It learns from the steps it is told about:
//   - the decodes' own step time, a moving average per number of decodes (a step of 8 decodes
//     costs more than one of 1). A count not measured yet, or last measured 64 steps ago (the
//     caches grew), is due a measure: the scheduler runs that step with the decodes alone, since
//     prompts that keep arriving would otherwise leave no step to measure in;
//   - a prefill chunk's cost beside decodes as a line fitted by least squares to (its tokens, the
//     step's time less the decodes' estimate), older steps weighing less (0.9 per step): a fixed
//     part (one more segment: its attention and small operations) and a part per token. The
//     slope needs chunks of spread sizes; once chunks settle on one size the last slope fitted
//     stays and the fixed part follows the recent costs. The slope is at least half a token's
//     cost in a long prefill alone (32 tokens or more): noise over chunks of a few sizes can
//     flatten it to nothing (a chunk of 56 then took 4.7 decode steps on the TinyLlama shape).
// A chunk takes 85 % of the time left, its fixed part counted up to half of that: in a model so
// small that a step costs its count of operations, one more segment alone costs about a decode
// step, and prompts must still move in chunks worth it. Until two chunk sizes were seen, a chunk
// is the time left over the cost per token seen, and at least twice the last (so that a line can
// be fitted).
//
// The machine's noise: a step whose prompt work came out past the time it had, or past what the
// line foresaw where a fixed part was counted in half (a busy core, a slower moment), trims the
// aim of the next ones by 0.8, and each step within it gives back 2 % (down to a quarter, up to
// all of it): where steps vary, chunks stay far enough under the target that few steps pass it,
// which is what a running decode's inter-token latency sees (the TinyLlama mixed load: ITL p99
// during a 2,040-token prefill 3.9x the p50 without it untrimmed, 2.6x trimmed). A chunk past
// what it sized (the plan's floor, step_plan.h kMinChunk, where the time left held less) neither
// trims nor gives back: it overruns a line it was never fitted to, and trimming on it pinned
// the aim at its floor on quota'd consumers whose rebuild pieces took each step's time (the
// knee, bench/README.md), shrinking every chunk after the pieces were done.
//
// It also keeps what the prompt tokens cost the decodes beside them (the local prefill's ITL cost
// per token, which auto weighs): each step's time past its decodes' estimate, over its tokens.
// The estimate is the moving average of the decodes' measures alone, so a measure taken in a
// slower moment makes the prompt work beside it look cheaper, or free, until later measures
// (one every 64 steps at most) outweigh it.
//
// Thread-safety: not thread-safe (the scheduler's thread owns it).
#ifndef SCD_CONSUMER_STEP_PACER_H_
#define SCD_CONSUMER_STEP_PACER_H_

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace scd::consumer {

// A cost per token as decayed sums {seconds, tokens}: each Add weighs the earlier ones 0.95
// (what prompt work costs the decodes beside it; the scheduler keeps rebuilds' the same way, and
// a rebuild row's price, step_plan.h RebuildPrice).
struct ItlCost {
  double seconds = 0, tokens = 0;
  // Adds `s` seconds (negative counts as none) spent on `t` tokens.
  void Add(double s, double t);
  double UsPerToken() const { return tokens > 0 ? seconds / tokens * 1e6 : 0; }
};

class StepPacer {
 public:
  // `step_slack`: a step with prompt work beside decodes aims at no more than this many times
  // the decodes' own step time. `max_decodes`: decode counts past it share its estimate.
  StepPacer(double step_slack, int64_t max_decodes);

  // Whether a step of `decodes` decodes should run them alone, to measure them.
  bool NeedsMeasure(int64_t decodes) const;
  // The step time of `decodes` decodes alone, seconds (the nearest measured count below, else
  // above, when this one is not measured; 0: none measured).
  double DecodeStepEstimate(int64_t decodes) const;
  // Seconds a step of `decodes` decodes may spend on other work (infinite with no decodes).
  double Allowed(int64_t decodes) const;
  // Prompt tokens a step beside decodes may take in `allowed` seconds (0 until a chunk's cost
  // was seen: the scheduler's floor then measures it).
  int64_t ChunkTokens(double allowed) const;
  // A step ran: `decodes` decodes and `prefill_tokens` prompt tokens in `seconds`, planned with
  // `allowed` seconds beside the decodes (ChunkTokens' argument).
  void Observe(int64_t decodes, int64_t prefill_tokens, double seconds, double allowed);
  // The share of the time left that chunks aim at now, after trims for steps past it (0.85 at
  // most).
  double aim() const;

  // The fitted chunk cost {fixed seconds, seconds per token}; none until chunks of spread sizes
  // were seen.
  std::optional<std::pair<double, double>> ChunkLine() const;
  // What the prompt tokens of steps beside decodes added to those steps, per token (steps
  // before any decodes were measured count for nothing).
  const ItlCost& local_itl() const { return local_itl_; }

 private:
  double step_slack_;
  std::vector<double> decode_step_s_;        // [decodes]
  // [decodes]: steps_ at its last measure, -1 = not measured (a step may take no time: on a
  // simulated clock, or below the clock's resolution).
  std::vector<int64_t> decode_measured_at_;
  int64_t steps_ = 0;
  // Decayed sums of 1, p, p^2, y, p*y over chunks (p tokens, y seconds).
  double w_ = 0, wp_ = 0, wpp_ = 0, wy_ = 0, wpy_ = 0;
  int64_t last_chunk_tokens_ = 0;
  double slope_ = 0;          // the last cost per token fitted from spread sizes (0: none)
  double trim_ = 1;           // (0.25, 1]: shrunk by steps past their time
  double alone_token_s_ = 0;  // the least a token cost in a prefill alone of 32 or more
  ItlCost local_itl_;
};

}  // namespace scd::consumer

#endif  // SCD_CONSUMER_STEP_PACER_H_
