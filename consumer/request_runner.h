// One Generate target on a consumer, start to end, in three parts: obtain the prompt's cache (the
// prefix cache's blocks, then the rest rebuilt layer by layer from the producer's transfer
// session, its compute run by the consumer's scheduler between decode steps; or nothing yet for a
// local prefill), hand the sequence to the consumer's DecodeScheduler (which prefills what is
// left in chunks and decodes it in a batch with every other running sequence), and stream its
// events (SequenceStream): one Started, TokenDeltas, then exactly one terminal event (Finished or
// Error). The daemon's Generate handlers and the all-in-one server call this; tests call it
// directly.
//
// Prefix cache (ConsumerModel::prefix_cache): the cached blocks of the prompt's prefix are
// loaded first (Started.consumer_cached_tokens says how many positions) and the producer sends
// only the rest; the prefix's full blocks are stored once its cache is complete (for a transfer:
// rebuilt; for local: at the first token).
//
// The transferred prefix is the prompt minus its last token (that token's logits seed sampling,
// so the consumer always runs it itself): a 1-token prompt has nothing to transfer and runs local.
// When the transfer fails (producer lost, corrupt, refused) the request ends with Error, or, when
// GenerateRequest.allow_local_fallback is set, continues with the consumer's own prefill and says
// so in Finished.mode / mode_reason.
// A transfer that makes no progress (no session, or no chunk) for ConsumerModel::transfer_timeout
// ends DEADLINE_EXCEEDED (or falls back, when allowed), so its reservation is freed.
// Thread-safety: RunTarget is reentrant; concurrent calls share the model read-only and the
// scheduler.
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
#include "base/cancellation.h"
#include "codec/artifact.h"
#include "codec/frontier.h"
#include "codec/transfer_mode.h"
#include "codec/transfer_plan.h"
#include "consumer/consumer_prefix_cache.h"
#include "consumer/decode_scheduler.h"
#include "model/llama_model.h"
#include "proto/serving_metrics.h"
#include "scd/v1/inference.pb.h"
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
  // Not owned; required by StartTarget and the services (null: RunTarget runs a scheduler of
  // its own per call, batching nothing across calls -- tests).
  DecodeScheduler* scheduler = nullptr;
  // The longest a transfer may stall: its session not opened, or no chunk arriving.
  absl::Duration transfer_timeout = absl::Seconds(30);
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
};

// This request's transfer session, once the producer has opened it (waits up to `timeout`).
using SessionSource = std::function<absl::StatusOr<std::shared_ptr<transport::ReceiveSession>>(
    absl::Duration timeout)>;
// Receives every event, in order: those before the sequence is handed to the scheduler on the
// calling thread, the rest on the scheduler's (it must not block there).
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
  // Optional: lets a transfer wait for its session without a thread -- called once with the
  // longest wait and `ready`, which it calls once (on any thread) when `session` would return at
  // once: the session arrived, the transfer failed or was cancelled, or the wait timed out (then
  // `session` returns DEADLINE_EXCEEDED). StartTarget then returns, and the rest of the run
  // continues on a thread of its own.
  std::function<void(absl::Duration timeout, std::function<void()> ready)> on_session;
  // The prompt's ids when the caller has them already (CheckRequest); else RunTarget tokenizes.
  std::optional<std::vector<TokenId>> prompt_ids;
  // Optional: called once, on the calling thread, when the transfer failed and the target falls
  // back to its own prefill (request.allow_local_fallback), before that prefill runs, with a
  // Started event saying so (mode local, the mode_reason Finished will carry). The coordinator
  // learns from it that a consumer serves the request on its own and must not be cancelled
  // (Consumer.Decode, control.proto); it is not part of the public event stream.
  std::function<void(const v1::GenerateEvent& started)> on_fallback;
};

// Runs one target up to its sequence's hand-over to the consumer's scheduler (the prefix cache,
// the transfer and its rebuild run on the calling thread, or after a wait for the session without
// a thread on one of their own: RunContext::on_session), then returns: the scheduler's thread
// emits the rest and the terminal event and calls `done` -- no thread waits for the decode.
// Inputs refused, or a prefix that failed: the Error is emitted and `done` called before it
// returns. REQUIRES: consumer.scheduler set; `consumer` and `context.cancellation` outlive `done`.
void StartTarget(const ConsumerModel& consumer, const v1::GenerateRequest& request,
                 const TargetRoute& route, RunContext context, EventSink emit, RunDone done);

// StartTarget, waiting for its end (with a scheduler of its own when the consumer has none);
// returns the status the terminal event carries (OK for Finished).
absl::Status RunTarget(const ConsumerModel& consumer, const v1::GenerateRequest& request,
                       const TargetRoute& route, const RunContext& context, const EventSink& emit);

// The checks that need the model, done before the request is admitted (a refusal then ends the
// call as a whole, before any work): the prompt's ids (PromptIds), the sampling values, and the
// room: OUT_OF_RANGE "max_tokens" when the prompt plus max_tokens exceed the model's positions.
// Returns the prompt's ids (RunContext::prompt_ids, so RunTarget does not tokenize again).
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
