// One Generate target on a consumer, start to end, in three parts: obtain the prompt's cache (the
// prefix cache's blocks, then the rest rebuilt layer by layer from the producer's transfer
// session, its compute run by the consumer's scheduler between decode steps; or nothing yet for a
// local prefill), hand the sequence to the consumer's DecodeScheduler (which prefills what is
// left in chunks and decodes it in a batch with every other running sequence), and stream its
// events (SequenceStream): one Started, TokenDeltas, then exactly one terminal event (Finished or
// Error). The daemon's Generate handlers (consumer/served_request.h) call this.
//
// Prefix cache (ConsumerModel::prefix_cache): the cached blocks of the prompt's prefix are
// loaded first (Started.consumer_cached_tokens says how many positions) and the producer sends
// only the rest; the prefix's full blocks are stored once its cache is complete (for a transfer:
// rebuilt; for local: at the first token).
//
// The transferred prefix is the prompt minus its last token (that token's logits seed sampling,
// so the consumer always runs it itself): a 1-token prompt has nothing to transfer and runs local.
// When the transfer fails (producer lost, corrupt, refused) the request continues with the
// consumer's own prefill and says so in Finished.mode / mode_reason, unless it forbids that
// (GenerateRequest.allow_local_fallback set false: it ends with Error). A transfer that lost its
// producer first asks for a takeover (RunContext::take_over): the layers rebuilt are kept and
// another producer sends the rest (Finished.takeovers); the fallback comes only when none does.
// A transfer that makes no progress (no session, or no chunk) for ConsumerModel::transfer_timeout
// ends DEADLINE_EXCEEDED (or falls back, when allowed), so its reservation is freed.
// A target's run (TargetRun) is a state object advanced by events (the session arrived, codes
// received and rebuilt, its sequence's end); no thread waits for any of them.
// Thread-safety: StartTarget is reentrant; concurrent calls share the model read-only, the
// scheduler and the step queue.
#ifndef SCD_CONSUMER_REQUEST_RUNNER_H_
#define SCD_CONSUMER_REQUEST_RUNNER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "base/cancellation.h"
#include "base/clock.h"
#include "base/work_queue.h"
#include "codec/artifact.h"
#include "codec/frontier.h"
#include "codec/transfer_mode.h"
#include "codec/transfer_plan.h"
#include "consumer/consumer_prefix_cache.h"
#include "consumer/decode_scheduler.h"
#include "model/llama_model.h"
#include "scd/v1/inference.pb.h"
#include "serving/serving_metrics.h"
#include "tokenizer/tokenizer.h"
#include "transport/transfer_session.h"

namespace scd::consumer {

// The consumer's model, as every request on it sees it.
struct ConsumerModel {
  const LlamaModel* model = nullptr;     // not owned
  const Tokenizer* tokenizer = nullptr;  // not owned; null: ids only (dummy weights)
  std::string name;                      // routing name (GenerateEvent.target)
  TransferOptions transfer_options;      // as the producer's (same plan on both sides)
  uint32_t default_max_tokens = 128;
  absl::Duration default_deadline = absl::Seconds(60);
  ConsumerPrefixCache* prefix_cache = nullptr;  // not owned; null: no prefix cache
  ServingMetrics* metrics = nullptr;            // not owned; null: no metrics recorded
  DecodeScheduler* scheduler = nullptr;         // not owned; required
  // Not owned; required: where a request's steps run (its start, taking a transfer's chunks,
  // the fallback's cache) -- a few threads fixed by configuration, never one per request.
  WorkQueue* steps = nullptr;
  Clock* clock = nullptr;  // deadlines, the transfer timeout, timings; null: Clock::Real()
  // The longest a transfer may stall: its session not opened, or no chunk arriving.
  absl::Duration transfer_timeout = absl::Seconds(30);
  // After a transfer lost its producer: how long a takeover's session may take to arrive
  // (RunContext::take_over) before the target falls back; and how many takeovers one target
  // may ask for.
  absl::Duration takeover_wait = absl::Seconds(2);
  uint32_t max_takeovers = 2;
};

// What routing decided for this target.
struct TargetRoute {
  TransferMode mode = TransferMode::kLocal;
  std::string mode_reason = "requested";
  std::string producer;                // producer model name ("" for local)
  const Artifact* artifact = nullptr;  // for reuse / scd: the pair's artifact (not owned)
  // Where the codes come from (the consumer's prefix cache keeps caches of different codes apart).
  std::string producer_fingerprint = {};  // the producer's codec fingerprint ("" for local)
  std::string artifact_id = {};           // the artifact's id ("" when none)
  // scd: the frontier point the coordinator chose (DecodeRequest.point, checked against the
  // artifact); unset: the fitted configuration at this node's code precision.
  std::optional<FrontierPoint> point = {};
  double expected_kl = 0;  // the frontier's KL at `point` (Started.expected_kl)
  // The producer was asked before this consumer's Started (DecodeRequest.early_prefill): its
  // codes cover the whole prefix, none of it is loaded from the prefix cache.
  bool early_prefill = false;
  // It was early, but queued on this consumer: the early session was refused and the codes come
  // once it is admitted (Started.early_prefill_declined; consumer/served_request.h).
  bool early_declined = false;
  // A moved stream's continuation (DecodeRequest.continued_ids): the last `continued` prompt ids
  // are output tokens another replica already streamed. They are prefilled with the prompt,
  // replayed through the detokenizer and stop strings without being emitted, and counted as
  // output (max_tokens, Finished). A transfer's codes cover the prompt without them (the tail
  // runs the prompt's last token); the scheduler prefills them on top of the rebuilt prompt.
  int64_t continued = 0;
  // The continued ids were decoded on locally prefilled caches only (DecodeRequest.continued_mode
  // LOCAL): a greedy continuation prefilled locally here refuses ids it would not pick
  // (consumer/continuation_check.h); otherwise they are only counted.
  bool continued_exact = false;
};

// This request's transfer session, once the producer has opened it (waits up to `timeout`).
using SessionSource = std::function<absl::StatusOr<std::shared_ptr<transport::ReceiveSession>>(
    absl::Duration timeout)>;
// Receives every event, in order, on the thread of the step that makes it (the caller's, a
// step-queue thread, the scheduler's): it must not block.
using EventSink = std::function<void(const v1::GenerateEvent&)>;
// Told once how a target ended: the status its terminal event carried (OK for Finished).
using RunDone = std::function<void(absl::Status)>;

struct RunContext {
  absl::Time received = absl::Now();             // request arrival (Timings.queue, ttft, total)
  absl::Time call_deadline = absl::InfiniteFuture();  // the call's gRPC deadline (ServedRequest)
  // The request's cancellation (not owned; null: none): once cancelled the request ends with
  // "cancelled", its transfer session ends at once, and the session source's wait must be woken
  // by it (ServeRequest fails the session's ticket from a callback).
  Cancellation* cancellation = nullptr;
  SessionSource session;  // required unless the route is local
  // Lets a transfer wait for its session without a thread -- called once with the longest wait
  // and `ready`, which it calls once (on any thread) when `session` would return at once: the
  // session arrived, the transfer failed or was cancelled, or the wait timed out (then `session`
  // returns DEADLINE_EXCEEDED). The run continues as a job on the step queue. Unset: `session`
  // waits on a step-queue thread (a caller whose session is there already).
  std::function<void(absl::Duration timeout, std::function<void()> ready)> on_session;
  // The prompt's ids when the caller has them already (CheckRequest); else StartTarget tokenizes.
  std::optional<std::vector<TokenId>> prompt_ids;
  // Optional: called once, on a step-queue thread, when the transfer failed and the target falls
  // back to its own prefill (unless request.allow_local_fallback forbids it), before that prefill
  // runs, with a Started event saying so (mode local, the mode_reason Finished will carry). The
  // coordinator learns from it that a consumer serves the request on its own and must not be
  // cancelled (Consumer.Decode, control.proto); it is not part of the public event stream.
  std::function<void(const v1::GenerateEvent& started)> on_fallback;
  // Optional: a takeover (control.proto TransferLost). Called on a step-queue thread when the
  // transfer lost its producer (ProducerLost: the producer gave the session up, peer loss or the
  // coordinator's report; not this consumer's checks, a cancel or the deadline): sends `notice`
  // (its transfer_lost) to the coordinator and expects the rest of the codes under the takeover's
  // session id; returns how to wait for that session (as `session` and `on_session` above; the
  // wait is woken by `cancellation` too), or an error: no takeover, the target falls back.
  struct Takeover {
    SessionSource session;
    std::function<void(absl::Duration timeout, std::function<void()> ready)> on_session;
  };
  using TakeoverAsk = std::function<absl::StatusOr<Takeover>(const v1::GenerateEvent& notice,
                                                             Cancellation* cancellation)>;
  TakeoverAsk take_over;
};

// Runs one target: Started, the prefix (cached, transferred and rebuilt, or left to the
// scheduler's prefill), the sequence's hand-over to the consumer's scheduler, whose thread emits
// the rest and the terminal event and calls `done`. Begins on the calling thread (the prefix
// cache, the plan, Started) and returns; the rest runs on events. Inputs refused, or a prefix
// that failed: the Error is emitted and `done` called (before it returns for inputs refused).
// REQUIRES: consumer.scheduler and consumer.steps set; `consumer` and `context.cancellation`
// outlive `done`.
void StartTarget(const ConsumerModel& consumer, const v1::GenerateRequest& request,
                 const TargetRoute& route, RunContext context, EventSink emit, RunDone done);

// The checks that need the model, done before the request is admitted (a refusal then ends the
// call as a whole, before any work): the prompt's ids (PromptIds), the sampling values, and the
// room: OUT_OF_RANGE "max_tokens" when the prompt plus max_tokens exceed the model's positions.
// Returns the prompt's ids (RunContext::prompt_ids, so StartTarget does not tokenize again).
absl::StatusOr<std::vector<TokenId>> CheckRequest(const ConsumerModel& consumer,
                                                  const v1::GenerateRequest& request);

// The KV bytes a request reserves at admission: (prompt + max_tokens, at most the model's
// positions) x the model's KV bytes per position.
int64_t ReservationBytes(const ConsumerModel& consumer, const v1::GenerateRequest& request,
                         size_t prompt_tokens);

// When a request must have ended: `received` plus its deadline_ms (the consumer's default when
// unset), or the call's own deadline when that is sooner (RunContext::call_deadline).
absl::Time RequestDeadline(const ConsumerModel& consumer, const v1::GenerateRequest& request,
                           absl::Time received, absl::Time call_deadline);

// The prompt's token ids as the consumer sees them (prompt_ids, or the prompt tokenized with the
// model's special tokens). INVALID_ARGUMENT: neither or both given, empty, ids out of vocabulary;
// OUT_OF_RANGE: longer than the model's maximum positions.
absl::StatusOr<std::vector<TokenId>> PromptIds(const ConsumerModel& consumer,
                                               const v1::GenerateRequest& request);

}  // namespace scd::consumer

#endif  // SCD_CONSUMER_REQUEST_RUNNER_H_
