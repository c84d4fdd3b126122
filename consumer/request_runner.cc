#include "consumer/request_runner.h"

#include <algorithm>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/awaited.h"
#include "base/exception_guard.h"
#include "base/status_macros.h"
#include "base/thread_name.h"
#include "codec/code_decoder.h"
#include "codec/code_encoder.h"
#include "codec/transfer_mode.h"
#include "consumer/code_receiver.h"
#include "consumer/sequence_stream.h"
#include "model/generator.h"
#include "proto/frontier_proto.h"
#include "proto/request_validation.h"
#include "proto/wire_mode.h"
#include "tokenizer/prompt_ids.h"

namespace scd::consumer {
namespace {

uint64_t Micros(absl::Duration d) {
  return static_cast<uint64_t>(std::max<int64_t>(0, absl::ToInt64Microseconds(d)));
}

// How the prefix's cache came to be.
struct PrefixOutcome {
  TransferMode mode = TransferMode::kLocal;  // the mode actually used
  std::string reason;                        // and why
  int64_t cached_tokens = 0;  // positions the prefix cache held (0 after a fallback)
  int64_t payload_bytes = 0;
  absl::Duration transfer = absl::ZeroDuration();
  absl::Duration rebuild = absl::ZeroDuration();
  absl::Duration patch = absl::ZeroDuration();
  absl::Duration last_rebuild = absl::ZeroDuration();
  // Rebuilt from codes: the last prompt token's logits, run layer by layer as the cache was
  // rebuilt (the cache then holds the whole prompt), and the time its steps took.
  at::Tensor first_logits;
  absl::Duration tail = absl::ZeroDuration();
  std::vector<LoweredLayer> lowered;  // layers whose codes came below the plan's ranks
};

// "; the link fell behind: layers 5 (K 3, V 6), 7 (H 16) sent at lower ranks".
std::string LoweredText(const std::vector<LoweredLayer>& lowered) {
  std::vector<std::string> parts;
  for (const LoweredLayer& l : lowered) {
    std::vector<std::string> ranks;
    if (l.rank_k > 0) ranks.push_back(absl::StrCat("K ", l.rank_k));
    if (l.rank_v > 0) ranks.push_back(absl::StrCat("V ", l.rank_v));
    if (l.rank_h > 0) ranks.push_back(absl::StrCat("H ", l.rank_h));
    parts.push_back(absl::StrCat(l.layer, " (", absl::StrJoin(ranks, ", "), ")"));
  }
  return absl::StrCat("; the link fell behind: layer", lowered.size() > 1 ? "s " : " ",
                      absl::StrJoin(parts, ", "), " sent at lower ranks");
}

// What the producer's plan sends for this route and prefix, as this consumer expects it (same
// architecture on both sides: the consumer's config makes the producer's plan).
struct ExpectedTransfer {
  TransferPlan plan;
  const Artifact* artifact = nullptr;  // for modes that need one
  std::vector<PlannedChunk> chunks;
};

absl::StatusOr<ExpectedTransfer> PlanTransfer(const ConsumerModel& consumer,
                                              const TargetRoute& route, int64_t tokens) {
  const TransferMode mode = route.mode;
  if (ModeServedWithArtifact(mode) && route.artifact == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "mode ", TransferModeName(mode), " needs the pair's artifact; this consumer has none"));
  }
  ExpectedTransfer expected;
  expected.artifact = ModeServedWithArtifact(mode) ? route.artifact : nullptr;
  const ModelConfig& config = consumer.model->config();
  const TransferOptions options =
      route.point ? TransferOptions::AtPoint(*route.point, consumer.transfer_options)
                  : consumer.transfer_options;
  SCD_ASSIGN_OR_RETURN(expected.plan, TransferPlan::Make(mode, config, expected.artifact, options));
  SCD_ASSIGN_OR_RETURN(
      expected.chunks,
      CodeEncoder(expected.plan, expected.artifact, options).PlannedChunks(config, tokens));
  return expected;
}

// Rebuilds the prefix `ids[0, T)` into `cache` from the producer's transfer session, its compute
// paced by the consumer's scheduler. `begin`: positions the cache holds already (the transfer
// covers the rest).
absl::StatusOr<ReceiveReport> RebuildFromCodes(const ConsumerModel& consumer,
                                               DecodeScheduler& scheduler,
                                               const ExpectedTransfer& expected,
                                               const std::vector<TokenId>& prefix,
                                               const RunContext& context, absl::Time deadline,
                                               int64_t begin, KvCache* cache, LayerStepper* tail) {
  const Artifact* artifact = expected.artifact;
  CodeDecoder decoder(*consumer.model, artifact);
  if (!context.session) return absl::InternalError("no transfer session source");
  // Waits for the producer's session (a cancellation wakes the wait: RunContext); a producer
  // that never opens it frees the reservation after the transfer timeout.
  const absl::Time give_up = std::min(deadline, absl::Now() + consumer.transfer_timeout);
  auto cancelled = [&context] {
    return context.cancellation != nullptr && context.cancellation->cancelled();
  };
  if (cancelled()) return absl::CancelledError("cancelled by the caller before the transfer began");
  absl::StatusOr<std::shared_ptr<transport::ReceiveSession>> opened =
      context.session(std::max(absl::ZeroDuration(), give_up - absl::Now()));
  if (cancelled()) {
    if (opened.ok()) (*opened)->Cancel("cancelled by the caller before the transfer began");
    return absl::CancelledError("cancelled by the caller before the transfer began");
  }
  if (absl::IsDeadlineExceeded(opened.status())) {
    return absl::DeadlineExceededError(
        give_up < deadline
            ? absl::StrCat("the producer opened no transfer session within the transfer timeout (",
                           absl::FormatDuration(consumer.transfer_timeout), ")")
            : "the producer opened no transfer session before the request's deadline");
  }
  SCD_ASSIGN_OR_RETURN(std::shared_ptr<transport::ReceiveSession> session, std::move(opened));
  // Codes are only meaningful from the producer the artifact was fitted for.
  if (artifact != nullptr &&
      session->header().producer_fingerprint() != artifact->producer.fingerprint) {
    const std::string why = absl::StrCat("the codes come from producer ",
                                         session->header().producer_fingerprint().substr(0, 12),
                                         ", the artifact was fitted for ", artifact->producer.name,
                                         " (", artifact->producer.fingerprint.substr(0, 12), ")");
    session->Cancel(why);
    return absl::PermissionDeniedError(why);
  }
  RebuildPacing pacing;
  pacing.run = [&scheduler](int64_t rows, int layers, const RebuildPacing::Piece& work) {
    return scheduler.RunBetweenSteps(rows, layers, work);
  };
  return ReceiveIntoCache(*session, decoder, expected.plan, expected.chunks, prefix, cache,
                          deadline - absl::Now(), context.cancellation, begin, tail, pacing,
                          consumer.transfer_timeout);
}

absl::StatusOr<GenerationOptions> GenerationOptionsFor(const ConsumerModel& consumer,
                                                       const v1::GenerateRequest& request) {
  // The generation values' bounds (proto/request_validation.h) again, cheaply: RunTarget may be
  // called directly, and nothing may wrap past int.
  SCD_RETURN_IF_ERROR(ValidateGenerationValues(request));
  GenerationOptions options;
  options.max_tokens = static_cast<int>(request.max_tokens() > 0 ? request.max_tokens()
                                                                 : consumer.default_max_tokens);
  options.sampling.temperature = request.temperature();
  options.sampling.top_k = static_cast<int>(request.top_k());
  options.sampling.top_p = request.top_p() > 0 ? request.top_p() : 1.0f;
  options.sampling.seed = request.seed();
  options.stop_strings.assign(request.stop().begin(), request.stop().end());
  if (!options.stop_strings.empty() && consumer.tokenizer == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("stop: ", consumer.name,
                     " is served without a tokenizer (dummy weights): no stop strings"));
  }
  options.top_logprobs = static_cast<int>(request.logprobs());
  SCD_RETURN_IF_ERROR(options.sampling.Validate());
  return options;
}

// The prefix's cache: rebuilt from codes (`planned`: the route's expected transfer; null for
// local), or left empty for the consumer's own prefill.
absl::StatusOr<PrefixOutcome> PreparePrefix(
    const ConsumerModel& consumer, DecodeScheduler& scheduler, const v1::GenerateRequest& request,
    const TargetRoute& route, const ExpectedTransfer* planned, const std::vector<TokenId>& ids,
    const RunContext& context, absl::Time deadline, int64_t cached_tokens, KvCache* cache) {
  PrefixOutcome outcome;
  outcome.mode = route.mode;
  outcome.reason = route.mode_reason;
  outcome.cached_tokens = cached_tokens;
  if (planned == nullptr) return outcome;
  const std::vector<TokenId> prefix(ids.begin(), ids.end() - 1);
  // The last prompt token follows the rebuild layer by layer (model/layer_stepper.h).
  absl::StatusOr<LayerStepper> tail = LayerStepper::Start(
      *consumer.model, absl::MakeConstSpan(ids).last(1), static_cast<int64_t>(prefix.size()));
  if (!tail.ok()) return tail.status();
  absl::StatusOr<ReceiveReport> received = RebuildFromCodes(
      consumer, scheduler, *planned, prefix, context, deadline, cached_tokens, cache, &*tail);
  if (received.ok()) {
    absl::StatusOr<at::Tensor> logits;
    SCD_RETURN_IF_ERROR(scheduler.RunBetweenSteps(1, 0, [&](int64_t, int64_t) {
      logits = tail->LastLogits();
      return logits.status();
    }));
    outcome.first_logits = *std::move(logits);
    outcome.tail = tail->compute_time();
    outcome.payload_bytes = received->bytes;
    outcome.transfer = received->last_chunk - received->first_chunk;
    outcome.rebuild = received->rebuild;
    outcome.patch = received->patch;
    outcome.last_rebuild = received->last_rebuild;
    outcome.lowered = received->lowered;
    if (!outcome.lowered.empty()) absl::StrAppend(&outcome.reason, LoweredText(outcome.lowered));
    return outcome;
  }
  const bool cancelled = context.cancellation != nullptr && context.cancellation->cancelled();
  if (!request.allow_local_fallback() || cancelled) return received.status();
  *cache = consumer.model->NewCache(cache->capacity());  // drop what was half rebuilt
  outcome.cached_tokens = 0;
  outcome.mode = TransferMode::kLocal;
  outcome.reason = absl::StrCat("fallback: the ", TransferModeName(route.mode),
                                " transfer failed (", received.status().ToString(), ")");
  return outcome;
}

// The Finished event of a target that decoded: how the prefix came to be and the sequence ended.
v1::Finished FinishedOf(const PrefixOutcome& prefix, const SequenceEnd& end, size_t prompt_tokens,
                        absl::Time start, absl::Time first_token, absl::Time received) {
  v1::Finished f;
  f.set_reason(std::string(FinishReasonName(absl::IsCancelled(end.status) ? FinishReason::kCancelled
                                                                          : end.finish_reason)));
  f.set_prompt_tokens(static_cast<uint32_t>(prompt_tokens));
  f.set_output_tokens(static_cast<uint32_t>(end.output_tokens));
  f.set_payload_bytes(static_cast<uint64_t>(prefix.payload_bytes));
  SetRanMode(prefix.mode, &f);
  f.set_mode_reason(prefix.reason);
  f.set_consumer_cached_tokens(static_cast<uint32_t>(prefix.cached_tokens));
  for (const LoweredLayer& l : prefix.lowered) {
    v1::LoweredLayer* out = f.add_lowered_layers();
    out->set_layer(static_cast<uint32_t>(l.layer));
    out->set_rank_k(static_cast<uint32_t>(l.rank_k));
    out->set_rank_v(static_cast<uint32_t>(l.rank_v));
    out->set_rank_h(static_cast<uint32_t>(l.rank_h));
  }
  v1::Timings* t = f.mutable_timings();
  t->set_queue(Micros(start - received));
  if (prefix.mode == TransferMode::kLocal) {
    t->set_prefill(Micros(end.prefill));
  } else {
    // The last prompt token's steps (most overlapped with the rebuild) and the first sampling.
    t->set_first_decode(Micros(prefix.tail + end.prefill));
  }
  t->set_transfer(Micros(prefix.transfer));
  t->set_rebuild(Micros(prefix.rebuild));
  t->set_patch(Micros(prefix.patch));
  t->set_last_rebuild(Micros(prefix.last_rebuild));
  t->set_ttft(first_token == absl::InfinitePast() ? 0 : Micros(first_token - received));
  t->set_total(Micros(absl::Now() - received));
  return f;
}

}  // namespace

absl::StatusOr<std::vector<TokenId>> PromptIds(const ConsumerModel& consumer,
                                               const v1::GenerateRequest& request) {
  const ModelConfig& config = consumer.model->config();
  return PromptTokenIds(consumer.tokenizer, request.prompt(),
                        absl::MakeConstSpan(request.prompt_ids().data(),
                                            static_cast<size_t>(request.prompt_ids_size())),
                        config.vocab_size, config.max_position_embeddings);
}

absl::StatusOr<std::vector<TokenId>> CheckRequest(const ConsumerModel& consumer,
                                                  const v1::GenerateRequest& request) {
  SCD_ASSIGN_OR_RETURN(std::vector<TokenId> ids, PromptIds(consumer, request));
  SCD_RETURN_IF_ERROR(GenerationOptionsFor(consumer, request).status());
  const int64_t positions = consumer.model->config().max_position_embeddings;
  const int64_t room = positions - static_cast<int64_t>(ids.size());
  if (request.max_tokens() > 0 && static_cast<int64_t>(request.max_tokens()) > room) {
    return absl::OutOfRangeError(absl::StrCat("max_tokens: the prompt's ", ids.size(),
                                              " tokens and max_tokens ", request.max_tokens(),
                                              " exceed the ", positions, " positions of ",
                                              consumer.name, " (at most ", room, " more tokens)"));
  }
  return ids;
}

absl::Time RequestDeadline(const ConsumerModel& consumer, const v1::GenerateRequest& request,
                           absl::Time received, absl::Time call_deadline) {
  const absl::Duration budget = request.deadline_ms() > 0
                                    ? absl::Milliseconds(request.deadline_ms())
                                    : consumer.default_deadline;
  return std::min(received + budget, call_deadline);
}

int64_t ReservationBytes(const ConsumerModel& consumer, const v1::GenerateRequest& request,
                         size_t prompt_tokens) {
  const ModelConfig& config = consumer.model->config();
  const int64_t max_tokens =
      request.max_tokens() > 0 ? request.max_tokens() : consumer.default_max_tokens;
  const int64_t positions = std::min<int64_t>(config.max_position_embeddings,
                                              static_cast<int64_t>(prompt_tokens) + max_tokens);
  return positions *
         config.KvBytesPerToken(static_cast<int64_t>(c10::elementSize(consumer.model->dtype())));
}

namespace {

// The target's Started event, as routing decided (the cached tokens and payload added later).
v1::GenerateEvent StartedEvent(const ConsumerModel& consumer, const v1::GenerateRequest& request,
                               const TargetRoute& route) {
  v1::GenerateEvent e;
  e.set_target(consumer.name);
  v1::Started* started = e.mutable_started();
  started->set_request_id(request.request_id());
  started->set_producer(route.mode == TransferMode::kLocal ? "" : route.producer);
  started->set_consumer(consumer.name);
  SetRanMode(route.mode, started);
  started->set_mode_reason(route.mode_reason);
  if (route.point && route.mode != TransferMode::kLocal) {
    *started->mutable_point() = CodePointToProto(*route.point);
    started->set_expected_kl(route.expected_kl);
  }
  return e;
}

// Loads the prefix cache's part of the prompt's prefix into `cache` (the route's scope: caches of
// different codes never mix); returns the positions it held (0 with no prefix cache), and the
// prefix's keys in *keys.
absl::StatusOr<int64_t> LoadCachedPrefix(const ConsumerModel& consumer,
                                         const v1::GenerateRequest& request,
                                         const TargetRoute& route, const std::vector<TokenId>& ids,
                                         std::optional<ConsumerPrefixCache::Keys>* keys,
                                         KvCache* cache) {
  const int64_t prefix_tokens = static_cast<int64_t>(ids.size()) - 1;
  if (consumer.prefix_cache == nullptr || prefix_tokens <= 0) return 0;
  *keys = consumer.prefix_cache->KeysFor(
      ConsumerPrefixCache::RouteScope(
          route.mode, route.producer_fingerprint,
          route.point ? absl::StrCat(route.artifact_id, "@", route.point->Describe())
                      : route.artifact_id),
      request.cache_salt(), absl::MakeConstSpan(ids).first(static_cast<size_t>(prefix_tokens)));
  // A transfer keeps at least one position to send; local prefill runs the last token anyway.
  const int64_t most = route.mode == TransferMode::kLocal ? prefix_tokens : prefix_tokens - 1;
  return consumer.prefix_cache->Load(**keys, most, prefix_tokens, cache);
}

// A transfer's plan for `tokens` positions (none for a local route), its payload noted in
// `started`.
absl::StatusOr<std::optional<ExpectedTransfer>> PlanFor(const ConsumerModel& consumer,
                                                        const TargetRoute& route, int64_t tokens,
                                                        v1::GenerateEvent* started) {
  if (route.mode == TransferMode::kLocal) return std::nullopt;
  SCD_ASSIGN_OR_RETURN(ExpectedTransfer plan, PlanTransfer(consumer, route, tokens));
  started->mutable_started()->set_expected_payload_bytes(
      static_cast<uint64_t>(TotalBytes(plan.chunks)));
  return plan;
}

// The Started a target sends when its transfer failed and it runs its own prefill.
v1::GenerateEvent FallbackNotice(const v1::GenerateEvent& started, const PrefixOutcome& prefix) {
  v1::GenerateEvent notice = started;
  SetRanMode(prefix.mode, notice.mutable_started());
  notice.mutable_started()->set_mode_reason(prefix.reason);
  notice.mutable_started()->clear_expected_payload_bytes();
  notice.mutable_started()->clear_point();
  notice.mutable_started()->clear_expected_kl();
  return notice;
}

// The Error a decode's end calls for (OK: it finished, or the client cancelled it).
absl::Status EndError(const SequenceEnd& end, absl::Duration budget) {
  if (end.status.ok() || absl::IsCancelled(end.status)) return absl::OkStatus();
  if (absl::IsDeadlineExceeded(end.status)) {
    return absl::DeadlineExceededError(
        absl::StrCat("deadline of ", absl::FormatDuration(budget), " reached while ",
                     end.first_token == absl::InfinitePast() ? "prefilling" : "decoding"));
  }
  return end.status;
}

// The Error event of a target that failed.
void EmitError(const ConsumerModel& consumer, const EventSink& emit, const absl::Status& status) {
  v1::GenerateEvent e;
  e.set_target(consumer.name);
  e.mutable_error()->set_code(static_cast<int32_t>(status.code()));
  e.mutable_error()->set_message(std::string(status.message()));
  emit(e);
}

// A target whose sequence the scheduler runs: what its end needs, kept until then (no thread
// waits for it). Ended, on the scheduler's thread, writes the Finished (or the Error), runs
// `done` and deletes it.
struct RunningTarget {
  const ConsumerModel* consumer = nullptr;
  EventSink emit;
  RunDone done;
  absl::Time start, received;
  absl::Duration budget;
  PrefixOutcome prefix;
  std::vector<TokenId> ids;
  std::optional<ConsumerPrefixCache::Keys> prefix_keys;  // unset: nothing to store
  bool stored = false;
  std::unique_ptr<SequenceStream> stream;

  // Stores the prefix's blocks this request computed, once its cache holds the whole prefix.
  void StorePrefix(const KvCache& complete) {
    if (stored || !prefix_keys.has_value()) return;
    stored = true;
    consumer->prefix_cache->Store(*prefix_keys, prefix.cached_tokens, complete);
  }
  void Ended(const SequenceEnd& end) {
    absl::Status status = EndError(end, budget);
    if (status.ok()) {
      v1::GenerateEvent finished;
      finished.set_target(consumer->name);
      *finished.mutable_finished() =
          FinishedOf(prefix, end, ids.size(), start, stream->first_token(), received);
      emit(finished);
    } else {
      EmitError(*consumer, emit, status);
    }
    const RunDone finish = std::move(done);
    delete this;  // the stream too: this is its last act (SequenceStream::Options::on_ended)
    finish(std::move(status));
  }
};

// One target from its checked inputs to the hand-over of its sequence (StartTarget): Begin runs
// up to the Started event; Continue the prefix (cached, transferred or prefilled) and the
// hand-over, whose end `running_` finishes. A transfer whose session can be waited for without a
// thread (RunContext::on_session) continues on a thread of its own once the session is there.
class TargetRun {
 public:
  TargetRun(const ConsumerModel& consumer, const v1::GenerateRequest& request, TargetRoute route,
            std::vector<TokenId> ids, GenerationOptions options, RunContext context,
            std::unique_ptr<RunningTarget> running)
      : consumer_(consumer),
        request_(request),
        route_(std::move(route)),
        ids_(std::move(ids)),
        options_(std::move(options)),
        context_(std::move(context)),
        running_(std::move(running)),
        deadline_(RequestDeadline(consumer, request, context_.received, context_.call_deadline)) {}

  // Runs it; a failure emits the Error and ends the target (RunningTarget::done).
  static void Run(std::unique_ptr<TargetRun> run) {
    if (absl::Status begun = run->Begin(); !begun.ok()) return Fail(std::move(run), begun);
    if (!run->planned_.has_value() || !run->context_.on_session) return Finish(std::move(run));
    // Waits for the producer's session with no thread; continues on one of its own.
    const absl::Duration timeout = std::max(
        absl::ZeroDuration(),
        std::min(run->deadline_, absl::Now() + run->consumer_.transfer_timeout) - absl::Now());
    TargetRun* waiting = run.release();
    waiting->context_.on_session(timeout, [waiting] {
      std::thread([waiting] {
        NameThisThread("scd-target-end");
        Finish(std::unique_ptr<TargetRun>(waiting));
      }).detach();
    });
  }

 private:
  static void Finish(std::unique_ptr<TargetRun> run) {
    absl::Status status = GuardExceptions("TargetRun", [&] { return run->Continue(); });
    if (!status.ok()) Fail(std::move(run), std::move(status));
  }
  // Emits the Error, gives back what the run holds (its session's ticket), then tells its end.
  static void Fail(std::unique_ptr<TargetRun> run, absl::Status status) {
    EmitError(run->consumer_, run->running_->emit, status);
    const RunDone finish = std::move(run->running_->done);
    run.reset();
    finish(std::move(status));
  }
  absl::Status Begin();
  absl::Status Continue();

  const ConsumerModel& consumer_;
  const v1::GenerateRequest request_;
  const TargetRoute route_;
  const std::vector<TokenId> ids_;
  const GenerationOptions options_;
  const RunContext context_;
  std::unique_ptr<RunningTarget> running_;  // null once handed over
  const absl::Time deadline_;
  v1::GenerateEvent started_;
  std::optional<KvCache> cache_;
  std::optional<ConsumerPrefixCache::Keys> prefix_keys_;
  int64_t cached_tokens_ = 0;
  std::optional<ExpectedTransfer> planned_;  // unset: local
};

absl::Status TargetRun::Begin() {
  started_ = StartedEvent(consumer_, request_, route_);
  // The prefix cache's part of the prefix: loaded before anything else happens.
  const int64_t capacity =
      std::min<int64_t>(consumer_.model->config().max_position_embeddings,
                        static_cast<int64_t>(ids_.size()) + options_.max_tokens);
  cache_ = consumer_.model->NewCache(capacity);
  const int64_t prefix_tokens = static_cast<int64_t>(ids_.size()) - 1;
  SCD_ASSIGN_OR_RETURN(
      cached_tokens_, LoadCachedPrefix(consumer_, request_, route_, ids_, &prefix_keys_, &*cache_));
  started_.mutable_started()->set_consumer_cached_tokens(static_cast<uint32_t>(cached_tokens_));
  SCD_ASSIGN_OR_RETURN(planned_,
                       PlanFor(consumer_, route_, prefix_tokens - cached_tokens_, &started_));
  running_->emit(started_);
  return absl::OkStatus();
}

absl::Status TargetRun::Continue() {
  DecodeScheduler& scheduler = *consumer_.scheduler;
  const int64_t prefix_tokens = static_cast<int64_t>(ids_.size()) - 1;
  absl::StatusOr<PrefixOutcome> prefix =
      PreparePrefix(consumer_, scheduler, request_, route_, planned_ ? &*planned_ : nullptr, ids_,
                    context_, deadline_, cached_tokens_, &*cache_);
  if (!prefix.ok()) return prefix.status();
  // Stores the prefix's blocks this request computed, once its cache holds the whole prefix.
  if (prefix->mode != route_.mode && prefix_keys_.has_value()) {
    // A fallback's cache is local: its own scope.
    prefix_keys_ = consumer_.prefix_cache->KeysFor(
        ConsumerPrefixCache::RouteScope(TransferMode::kLocal, "", ""), request_.cache_salt(),
        absl::MakeConstSpan(ids_).first(static_cast<size_t>(prefix_tokens)));
  }
  RunningTarget* r = running_.get();
  r->prefix = *std::move(prefix);
  r->ids = ids_;
  r->budget = deadline_ - context_.received;
  r->prefix_keys = std::move(prefix_keys_);
  // A prefix rebuilt from codes that arrived below the point's ranks is not what a later
  // request at this point would rebuild: never kept under its scope.
  if (!r->prefix.lowered.empty()) r->prefix_keys.reset();
  if (r->prefix.mode != TransferMode::kLocal) r->StorePrefix(*cache_);  // rebuilt
  if (r->prefix.mode != route_.mode && context_.on_fallback) {
    context_.on_fallback(FallbackNotice(started_, r->prefix));  // announced before it runs
  }
  // The scheduler prefills what is left (local) and decodes; the stream hands its events over
  // on the scheduler's thread, and its end finishes the target (RunningTarget::Ended).
  SequenceStream::Options stream_options;
  stream_options.target = consumer_.name;
  stream_options.tokenizer = consumer_.tokenizer;
  stream_options.stop_strings = options_.stop_strings;
  stream_options.top_logprobs = options_.top_logprobs;
  stream_options.on_prompt_done = [r](const KvCache& complete) { r->StorePrefix(complete); };
  stream_options.on_event = r->emit;
  stream_options.on_ended = [r](const SequenceEnd& end) { r->Ended(end); };
  r->stream = std::make_unique<SequenceStream>(std::move(stream_options), ids_);
  SequenceRequest sequence{
      ids_,
      *std::move(cache_),
      r->prefix.first_logits,
      options_,
      deadline_,
      context_.cancellation != nullptr ? context_.cancellation->flag() : nullptr,
      r->stream.get()};
  running_.release();  // from here the sequence's end owns it
  if (absl::Status submitted = scheduler.Submit(std::move(sequence)); !submitted.ok()) {
    running_.reset(r);  // refused: never handed over
    return submitted;
  }
  return absl::OkStatus();
}

}  // namespace

void StartTarget(const ConsumerModel& consumer, const v1::GenerateRequest& request,
                 const TargetRoute& route_in, RunContext context, EventSink emit, RunDone done) {
  auto running = std::make_unique<RunningTarget>();
  running->consumer = &consumer;
  running->emit = std::move(emit);
  running->done = std::move(done);
  running->start = absl::Now();
  running->received = context.received;
  auto fail = [&](absl::Status status) {
    EmitError(consumer, running->emit, status);
    const RunDone finish = std::move(running->done);
    running.reset();
    finish(std::move(status));
  };
  absl::StatusOr<std::vector<TokenId>> ids =
      context.prompt_ids.has_value() ? *context.prompt_ids : PromptIds(consumer, request);
  if (!ids.ok()) return fail(ids.status());
  absl::StatusOr<GenerationOptions> options = GenerationOptionsFor(consumer, request);
  if (!options.ok()) return fail(options.status());
  if (consumer.scheduler == nullptr) return fail(absl::InternalError("no decode scheduler"));
  TargetRoute route = route_in;
  if (route.mode != TransferMode::kLocal && ids->size() < 2) {
    route = TargetRoute{};
    route.mode_reason = "a 1-token prompt has no prefix to transfer";
  }
  TargetRun::Run(std::make_unique<TargetRun>(consumer, request, std::move(route), *std::move(ids),
                                             *std::move(options), std::move(context),
                                             std::move(running)));
}

absl::Status RunTarget(const ConsumerModel& consumer_in, const v1::GenerateRequest& request,
                       const TargetRoute& route, const RunContext& context, const EventSink& emit) {
  // Without the consumer's scheduler (tests calling this directly): one of its own, which
  // outlives the run (the call waits for its end).
  ConsumerModel consumer = consumer_in;
  std::optional<DecodeScheduler> own;
  if (consumer.scheduler == nullptr) {
    own.emplace(*consumer.model, SchedulerOptions());
    consumer.scheduler = &*own;
  }
  Awaited<absl::Status> ended;
  StartTarget(consumer, request, route, context, emit, ended.Setter());
  return ended.Wait();
}

}  // namespace scd::consumer
