// DecodeScheduler: continuous batching on one consumer. One thread advances every running
// sequence together, each step carrying out the plan PlanStep (consumer/step_plan.h) returns
// for the scheduler's state: a step is one LlamaModel::ForwardBatch over each decoding sequence's
// last token and chunks of local prefills (a rebuilt sequence's last prompt token is a one-token
// chunk), then every sequence that got logits picks its next token with its own GenerationState
// (its own sampling parameters and seeded sampler, so a seed gives the same tokens whatever else
// runs). Between steps, sequences that ended, were cancelled (their flag) or passed their
// deadline leave, new ones join, and rebuild work handed in by transfers runs (RunBetweenSteps):
// a joining sequence costs a step only its own new tokens, and nothing that waits (a transfer
// still arriving, a client reading slowly) holds a step up.
//
// Pacing -- what keeps running decodes at their pace while prompts arrive. The decodes always run.
// Prefill chunks and rebuild pieces fill the rest of a step, up to `max_batched_tokens` rows in
// all; while sequences decode, only as much as keeps the step within `step_slack` times the
// decodes' own step time, as StepPacer (consumer/step_pacer.h) learns them: the decodes' step
// time per number of decodes (measured alone when due), a prefill chunk's cost beside them as a
// fixed part and a part per token. Rebuild pieces are sized from their measured time per row
// and layer, each piece weighing by its rows (RebuildPrice, consumer/step_plan.h). Beside decodes a
// step stays within kSkinnyMaxRows rows (model/skinny_gemm.h). At least 16 rebuild rows and 2
// prefill tokens go into every step that has them, so nothing starves. With no sequence decoding,
// prefill and rebuild take the whole budget. A rebuild piece's rows count against the row budget
// times the layers it covers divided by the model's layers.
//
// Every submitted sequence ends exactly once (SequenceSink::Ended): finished ("stop" / "length"),
// cancelled, past its deadline, failed, or with UNAVAILABLE when the scheduler is destroyed. Its
// cache is freed and stats() stops counting it before its sink hears Ended.
//
// Thread-safety: thread-safe. A sequence's sink callbacks run on the scheduler's thread, in order;
// they must be quick and must not block (queue events for another thread to write).
#ifndef SCD_CONSUMER_DECODE_SCHEDULER_H_
#define SCD_CONSUMER_DECODE_SCHEDULER_H_

#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "base/finish_reason.h"
#include "base/token_id.h"
#include "codec/layerwise_rebuilder.h"
#include "consumer/step_log.h"
#include "consumer/step_pacer.h"
#include "consumer/step_plan.h"
#include "model/generator.h"
#include "model/kv_cache.h"
#include "model/llama_model.h"

namespace scd {
class ServingMetrics;
}

namespace scd::consumer {

struct SchedulerOptions {
  // Rows of one step at most: decodes, prefill chunk tokens and rebuild pieces (vLLM's
  // max_num_batched_tokens).
  int64_t max_batched_tokens = 512;
  // While sequences decode, a step with prefill or rebuild work beside them aims at no more than
  // this many times their own step time.
  double step_slack = 2.0;
  ServingMetrics* metrics = nullptr;  // not owned; null: no step metrics
  // Deadlines, the steps' and pieces' timings, a sequence's join and first token (not owned;
  // null: Clock::Real()).
  Clock* clock = nullptr;
  // The loop's own thread runs this much nicer than the process (Linux: niceness is per thread;
  // 0: as the process). The steps run back to back while anything decodes, so on a busy CPU the
  // threads that answer the network -- a cancel, a deadline, an admission, an event write --
  // would otherwise wait for the kernel to end the loop's time slice (~5 ms); a nicer loop is
  // preempted as soon as one of them wakes and loses nothing when they sleep. BLAS's own worker
  // threads keep the process's niceness.
  int nice = 10;
  // The steps' account in the log every this often (consumer/step_log.h: busy share, tokens,
  // batch, the pacer's aim); zero: none.
  absl::Duration step_log_interval = absl::Seconds(10);
};

// How a sequence ended.
struct SequenceEnd {
  // OK: finished (finish_reason kStop or kLength); CANCELLED (its flag; kCancelled),
  // DEADLINE_EXCEEDED, UNAVAILABLE (the scheduler stopped), or the model's error.
  absl::Status status;
  FinishReason finish_reason = FinishReason::kNone;
  int64_t output_tokens = 0;
  absl::Time joined = absl::InfinitePast();       // the first step it took part in
  absl::Time first_token = absl::InfinitePast();  // its first token picked (InfinitePast: none)
  absl::Duration prefill = absl::ZeroDuration();  // joined -> first token
};

// The owner's side of a sequence (scheduler thread; see the file comment).
class SequenceSink {
 public:
  virtual ~SequenceSink() = default;
  // Every prompt position is in the cache (after its last prefill chunk, or at joining when it
  // came with its first logits). The cache is valid during the call only.
  virtual void PromptDone(const KvCache& cache) { (void)cache; }
  // For a sequence that asked (SequenceRequest::prompt_logits_from): float32 logits
  // [rows, vocab] of prompt positions [first, first + rows), as a prefill chunk ran them (the
  // prompt's last position among them, in its last chunk). Non-OK ends the sequence with it.
  virtual absl::Status PromptLogits(int64_t first, const at::Tensor& logits) {
    (void)first;
    (void)logits;
    return absl::OkStatus();
  }
  // An output token; false ends the sequence ("stop").
  virtual bool Token(TokenId id, const TokenLogprobs& logprobs) = 0;
  // Exactly once, last.
  virtual void Ended(const SequenceEnd& end) = 0;
};

struct SequenceRequest {
  std::vector<TokenId> prompt;
  // Holds positions [0, k) of the prompt in every layer: k < prompt.size(), the rest is
  // prefilled here in chunks; or k == prompt.size() with `first_logits` (float32 [1, vocab],
  // the last prompt token's, from a rebuild that ran it layer by layer: its first token is
  // picked in the step it joins, ahead of that step's forward).
  KvCache cache;
  at::Tensor first_logits;
  GenerationOptions options;  // max_tokens, sampling, stop ids, top_logprobs
  absl::Time deadline = absl::InfiniteFuture();
  const std::atomic<bool>* cancelled = nullptr;  // may be null
  SequenceSink* sink = nullptr;                  // not owned; outlives the sequence
  // The logits of every prompt position from here on that a prefill chunk runs go to the sink
  // (SequenceSink::PromptLogits): a moved stream's continued ids are checked by them. Unset: only
  // the last position's, to sample from.
  std::optional<int64_t> prompt_logits_from = std::nullopt;
};

class DecodeScheduler {
 public:
  // REQUIRES: `model` outlives the scheduler.
  DecodeScheduler(const LlamaModel& model, SchedulerOptions options);
  ~DecodeScheduler();  // ends every sequence (UNAVAILABLE) and fails waiting work; joins
  DecodeScheduler(const DecodeScheduler&) = delete;
  DecodeScheduler& operator=(const DecodeScheduler&) = delete;

  // Hands a sequence over; it joins at the next step. INVALID_ARGUMENT (nothing is called on the
  // sink): no sink, bad options, a cache that does not fit the prompt; UNAVAILABLE once stopping.
  absl::Status Submit(SequenceRequest request);

  // Runs `work` over rows [0, rows) of `layers` layers on the scheduler's thread, in pieces
  // between steps as the pacing allows (at least 16 rows a step), in order, then calls `done` with
  // the first error or OK, on the scheduler's thread; no thread waits meanwhile. Work handed in
  // earlier runs first. This is RebuildPacing::run for the transfers to this consumer. `done` runs
  // at once, on the calling thread, for rows <= 0 (OK) and once stopping (UNAVAILABLE); work
  // waiting when the scheduler stops gets UNAVAILABLE. `done` must not block (it runs between
  // steps): it hands what follows to a queue, or hands in more work.
  void RunBetweenSteps(int64_t rows, int layers, RebuildPacing::Piece work,
                       std::function<void(absl::Status)> done);

  struct Stats {
    int64_t running = 0;         // sequences joined and not ended
    int64_t decoding = 0;        // of which past their prompt
    int64_t pending_work = 0;    // rebuild pieces waiting for a step
    int64_t steps = 0;           // steps run
    int64_t max_batch = 0;       // the most sequences one step advanced
    double decode_step_ms = 0;   // the estimated step time of the decodes running now, alone
    int64_t chunk_tokens = 0;    // prefill tokens the last step beside decodes could take
    // What prompt work costs the sequences decoding beside it (0: not seen yet): the seconds a
    // step spends past its decodes' own time, per prompt token of a local prefill chunk it
    // carried, and per token rebuilt from codes between steps (a piece of n rows over l of the
    // model's L layers: n * l / L tokens). Every decoding sequence waits that long for its next
    // token: a prompt of n tokens costs each one n times it in inter-token latency. Moving
    // averages over the steps that had decodes.
    double local_itl_us_per_token = 0;
    double rebuild_itl_us_per_token = 0;
    // How fast a local prefill advances beside decoding sequences: the whole time of the steps
    // that carried its chunks per prompt token (it moves only in their slack), moving like the
    // above (0: not seen).
    double busy_prefill_us_per_token = 0;
  };
  Stats stats() const;
  const SchedulerOptions& options() const { return options_; }

 private:
  struct Sequence;
  struct Work {
    int64_t rows = 0;
    int layers = 0;
    RebuildPacing::Piece fn;
    std::function<void(absl::Status)> done;
    int64_t next_row = 0;  // scheduler thread only
  };

  // What one step runs, as the model takes it: the plan's batch (consumer/step_plan.h) with its
  // sequences and their prompt tokens (0 for a decode).
  struct Batch {
    int64_t decodes = 0, prefill_tokens = 0;
    std::vector<BatchSequence> inputs;
    std::vector<Sequence*> members;
    std::vector<int64_t> chunk;
  };

  void Loop();
  // One step: PlanStep's plan, carried out -- leaves, rebuild pieces, the batched forward,
  // sampling.
  void Step(std::list<std::unique_ptr<Sequence>>& running);
  // The state the planner sees; `queued` gets the rebuild work it indexes.
  StepState ViewOf(const std::vector<Sequence*>& running, std::vector<Work*>* queued) const;
  static Batch BatchOf(const StepPlan& plan, const std::vector<Sequence*>& members);
  // Publishes the step's stats (a sequence that left is a release: base/release_clock.h).
  void Publish(const std::list<std::unique_ptr<Sequence>>& running, const Batch& batch);
  // Drops the ended sequences (their caches freed), publishes the stats without them, then tells
  // their sinks: whoever saw a sequence end sees stats that no longer count it.
  void Settle(std::list<std::unique_ptr<Sequence>>& running, const Batch& batch);
  // Tells the pacer and the metrics about a step whose forward took `took` seconds, planned with
  // `allowed` seconds beside its decodes for its prompt chunks.
  void Learn(const Batch& batch, double took, double allowed);
  // A prefill chunk of `seq` ran (prompt_next past it) with `*logits` (undefined: none asked):
  // its sink gets the rows it asked for; true when the prompt is done and *logits is the last
  // position's (its first token is picked from it); false while chunks remain or when it ended.
  bool PromptChunkRan(Sequence& seq, at::Tensor* logits);
  // The sequence picks its next token from `logits`, or ends.
  void Pick(Sequence& seq, const at::Tensor& logits);
  // Marks `seq` ended; its sink hears it at the next Settle.
  void End(Sequence& seq, absl::Status status, FinishReason reason);
  // Runs the plan's rebuild pieces (`queued`: the work the plan indexes), timing each.
  void RunPieces(const StepPlan& plan, const std::vector<Work*>& queued);
  // Adds the step that began at `start` to the step log, and logs its line when due.
  void Account(const StepPlan& plan, absl::Time start, absl::Time pieces_end, int64_t running);

  const LlamaModel& model_;
  const SchedulerOptions options_;
  Clock* const clock_;
  const StepLimits limits_;

  mutable absl::Mutex mu_;
  std::deque<std::unique_ptr<Sequence>> incoming_ ABSL_GUARDED_BY(mu_);
  std::deque<std::unique_ptr<Work>> work_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  Stats stats_ ABSL_GUARDED_BY(mu_);

  // Moving averages (scheduler thread only; copied into stats_ under mu_).
  StepPacer pacer_;
  RebuildPrice rebuild_price_;  // what a rebuild row costs per layer, from the pieces run
  int64_t last_chunk_budget_ = 0;
  // Decayed sums behind Stats' rebuild ITL cost and busy prefill pace (the local ITL cost is the
  // pacer's).
  ItlCost rebuild_itl_, busy_prefill_;
  StepLog step_log_;  // scheduler thread only
  // Ends not yet told to their sinks (scheduler thread only; Settle tells them).
  std::vector<std::pair<SequenceSink*, SequenceEnd>> ends_;

  std::thread thread_;
};

}  // namespace scd::consumer

#endif  // SCD_CONSUMER_DECODE_SCHEDULER_H_
