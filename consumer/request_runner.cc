#include "consumer/request_runner.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/exception_guard.h"
#include "base/status_macros.h"
#include "codec/code_decoder.h"
#include "codec/code_encoder.h"
#include "codec/transfer_mode.h"
#include "consumer/code_receiver.h"
#include "consumer/continuation_check.h"
#include "consumer/sequence_stream.h"
#include "consumer/target_events.h"
#include "consumer/target_prefix.h"
#include "model/generator.h"
#include "model/layer_stepper.h"
#include "proto/request_validation.h"
#include "tokenizer/prompt_ids.h"

namespace scd::consumer {
namespace {

absl::StatusOr<GenerationOptions> GenerationOptionsFor(const ConsumerModel& consumer,
                                                       const v1::GenerateRequest& request) {
  // The generation values' bounds (proto/request_validation.h) again, cheaply: StartTarget may be
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

Clock* ClockOf(const ConsumerModel& consumer) {
  return consumer.clock != nullptr ? consumer.clock : Clock::Real();
}

// One target from its checked inputs to its end (StartTarget): a state object advanced by
// events, no thread waiting for any of them --
//   Start    (the caller's thread): the prefix cache's part, the plan, Started; a local target
//            goes straight to its hand-over;
//   the producer's session arrives (RunContext::on_session) -> Receive (a step-queue job): the
//            codes received and rebuilt layer by layer (consumer/code_receiver.h), the rebuild's
//            compute run by the scheduler between decode steps;
//   received -> the last prompt token's logits (a piece on the scheduler) -> Rebuilt, there on
//            the scheduler's thread (after a failure: a job);
//   Handover: the sequence to the scheduler, which hands each token's event over on its thread;
//   Ended   (the scheduler's thread): the Finished (or the Error), `done`.
// A transfer that fails ends the target with its Error, or falls back to local prefill when the
// request allows it (PrefixFailed). Steps run one at a time, each set off by the one before. The
// run owns itself through the callbacks it is waiting for: the last one lets it go.
class TargetRun : public std::enable_shared_from_this<TargetRun> {
 public:
  TargetRun(const ConsumerModel& consumer, const v1::GenerateRequest& request, TargetRoute route,
            std::vector<TokenId> ids, GenerationOptions options, RunContext context, EventSink emit,
            RunDone done)
      : consumer_(consumer),
        clock_(ClockOf(consumer)),
        start_(clock_->Now()),
        request_(request),
        route_(std::move(route)),
        ids_(std::move(ids)),
        options_(std::move(options)),
        context_(std::move(context)),
        emit_(std::move(emit)),
        done_(std::move(done)),
        deadline_(RequestDeadline(consumer, request, context_.received, context_.call_deadline)) {}

  void Start();

 private:
  absl::Status Begin();
  // Runs `step` as a job on the consumer's step queue (exceptions end the target).
  void Post(void (TargetRun::*step)());
  // Runs `step` here, on the calling thread (exceptions end the target).
  void RunStep(void (TargetRun::*step)());
  void Receive();
  void Received(absl::StatusOr<ReceiveReport> report);
  void Rebuilt();
  // The transfer failed: a takeover asked for, the Error, or the fallback to local prefill.
  void PrefixFailed(const absl::Status& why);
  // Asks the coordinator for another producer to send the rest (RunContext::take_over); false
  // when the failure or the state allows none.
  bool AskTakeover(const absl::Status& why);
  void Handover(PrefixOutcome prefix);
  // The stream that turns the sequence's tokens into events; its callbacks hold the run.
  std::unique_ptr<SequenceStream> NewStream();
  // Stores the prefix's blocks this request computed, once its cache holds the whole prefix.
  void StorePrefix(const KvCache& complete);
  // The sequence ended (the scheduler's thread): Finished or the Error, then `done`.
  void Ended(const SequenceEnd& end);
  // Emits the Error and tells `done` (once; nothing after the hand-over: the sequence's end
  // tells).
  void Fail(absl::Status status);
  bool cancelled() const {
    return context_.cancellation != nullptr && context_.cancellation->cancelled();
  }
  // The prompt without a moved stream's continued ids: what a transfer's codes cover (all but
  // its last token) and its tail runs; the continued ids are prefilled on top by the scheduler.
  absl::Span<const TokenId> Prompt() const {
    return absl::MakeConstSpan(ids_).first(ids_.size() - static_cast<size_t>(route_.continued));
  }
  PrefixOutcome RouteOutcome() const {
    PrefixOutcome outcome;
    outcome.mode = route_.mode;
    outcome.reason = route_.mode_reason;
    outcome.cached_tokens = cached_tokens_;
    return outcome;
  }

  const ConsumerModel& consumer_;
  Clock* const clock_;
  const absl::Time start_;
  const v1::GenerateRequest request_;
  const TargetRoute route_;
  const std::vector<TokenId> ids_;
  const GenerationOptions options_;
  const RunContext context_;
  const EventSink emit_;
  RunDone done_;  // empty once told
  bool handed_over_ = false;
  const absl::Time deadline_;
  absl::Time give_up_ = absl::InfiniteFuture();  // no session by then: the transfer timed out
  v1::GenerateEvent started_;
  std::optional<KvCache> cache_;
  std::optional<ConsumerPrefixCache::Keys> prefix_keys_;
  int64_t cached_tokens_ = 0;
  std::optional<ExpectedTransfer> planned_;  // unset: local
  // A transfer's: the decoder, the prefix it covers, the last prompt token run layer by layer as
  // the layers are rebuilt, and what the receive reported.
  std::optional<CodeDecoder> decoder_;
  std::vector<TokenId> prefix_ids_;
  std::optional<LayerStepper> tail_;
  ReceiveReport report_;
  // The rebuild so far, kept for a takeover's receive; the chunks the current session sends.
  std::shared_ptr<ReceiveProgress> progress_ = std::make_shared<ReceiveProgress>();
  std::vector<PlannedChunk> expected_chunks_;
  // Takeovers asked for; a new one only once a session arrived since the last (a refused ask
  // is not asked again); the takeover's session, once asked.
  uint32_t takeovers_ = 0;
  bool may_ask_ = true;
  absl::Status lost_;  // why the transfer failed before the first takeover
  RunContext::Takeover takeover_;
  absl::StatusOr<at::Tensor> logits_;
  // From the hand-over: how the prefix came to be, whether its blocks are stored. The stream
  // (made before a transfer, else at the hand-over) holds the run through its callbacks until
  // the sequence's end, or until a failure before the hand-over lets it go.
  PrefixOutcome prefix_;
  bool stored_ = false;
  std::unique_ptr<SequenceStream> stream_;
  // A greedy continuation's received ids, judged by this replica's prefill (the tail's logits
  // for the first, the scheduler's prefill for the rest).
  std::optional<ContinuationCheck> check_;
};

void TargetRun::Start() {
  if (absl::Status begun = Begin(); !begun.ok()) return Fail(begun);
  if (!planned_.has_value()) return Handover(RouteOutcome());
  // Waits for the producer's session with no thread; a producer that never opens it frees the
  // reservation after the transfer timeout.
  const absl::Time now = clock_->Now();
  give_up_ = std::min(deadline_, now + consumer_.transfer_timeout);
  // Made while the codes are on their way (the detokenizer reads the prompt), not after.
  stream_ = NewStream();
  if (!context_.on_session) return Post(&TargetRun::Receive);
  std::shared_ptr<TargetRun> self = shared_from_this();
  context_.on_session(std::max(absl::ZeroDuration(), give_up_ - now),
                      [self] { self->Post(&TargetRun::Receive); });
}

void TargetRun::Post(void (TargetRun::*step)()) {
  std::shared_ptr<TargetRun> self = shared_from_this();
  consumer_.steps->Run([self, step] { self->RunStep(step); });
}

void TargetRun::RunStep(void (TargetRun::*step)()) {
  absl::Status status = GuardExceptions("TargetRun", [&] {
    (this->*step)();
    return absl::OkStatus();
  });
  if (!status.ok()) Fail(std::move(status));
}

absl::Status TargetRun::Begin() {
  started_ = StartedEvent(consumer_.name, request_, route_);
  if (route_.continued > 0 && options_.sampling.temperature == 0) {
    check_.emplace(ids_, route_.continued, consumer_.model->NearTieBound(),
                   route_.continued_exact && route_.mode == TransferMode::kLocal);
  }
  // The prefix cache's part of the prefix: loaded before anything else happens.
  const int64_t capacity =
      std::min<int64_t>(consumer_.model->config().max_position_embeddings,
                        static_cast<int64_t>(ids_.size()) + options_.max_tokens);
  cache_ = consumer_.model->NewCache(capacity);
  // A transfer covers the prompt's prefix; local prefill the continued ids too, unless they are
  // checked (their positions must then run here, not come from the prefix cache).
  const absl::Span<const TokenId> covered =
      route_.mode == TransferMode::kLocal && !check_.has_value() ? absl::MakeConstSpan(ids_)
                                                                 : Prompt();
  const int64_t prefix_tokens = static_cast<int64_t>(covered.size()) - 1;
  SCD_ASSIGN_OR_RETURN(cached_tokens_, LoadCachedPrefix(consumer_, request_, route_, covered,
                                                        &prefix_keys_, &*cache_));
  started_.mutable_started()->set_consumer_cached_tokens(static_cast<uint32_t>(cached_tokens_));
  SCD_ASSIGN_OR_RETURN(planned_,
                       PlanFor(consumer_, route_, prefix_tokens - cached_tokens_, &started_));
  emit_(started_);
  return absl::OkStatus();
}

void TargetRun::Receive() {
  constexpr char kBeforeTransfer[] = "cancelled by the caller before the transfer began";
  if (cancelled()) return Fail(absl::CancelledError(kBeforeTransfer));
  // Returns at once once on_session said so (else waits here: a caller without it).
  const SessionSource& source = takeover_.session ? takeover_.session : context_.session;
  absl::StatusOr<std::shared_ptr<transport::ReceiveSession>> opened =
      source(std::max(absl::ZeroDuration(), give_up_ - clock_->Now()));
  if (cancelled()) {
    if (opened.ok()) (*opened)->Cancel(kBeforeTransfer);
    return Fail(absl::CancelledError(kBeforeTransfer));
  }
  if (absl::IsDeadlineExceeded(opened.status())) {
    return PrefixFailed(absl::DeadlineExceededError(
        takeovers_ > 0 ? absl::StrCat("no producer took the transfer over within ",
                                      absl::FormatDuration(consumer_.takeover_wait))
        : give_up_ < deadline_
            ? absl::StrCat("the producer opened no transfer session within the transfer timeout (",
                           absl::FormatDuration(consumer_.transfer_timeout), ")")
            : "the producer opened no transfer session before the request's deadline"));
  }
  if (!opened.ok()) return PrefixFailed(opened.status());
  may_ask_ = true;  // a session came: its loss may be taken over
  std::shared_ptr<transport::ReceiveSession> session = *std::move(opened);
  // Codes are only meaningful from the producer the artifact was fitted for.
  const Artifact* artifact = planned_->artifact;
  if (artifact != nullptr &&
      session->header().producer_fingerprint() != artifact->producer.fingerprint) {
    const std::string why = absl::StrCat("the codes come from producer ",
                                         session->header().producer_fingerprint().substr(0, 12),
                                         ", the artifact was fitted for ", artifact->producer.name,
                                         " (", artifact->producer.fingerprint.substr(0, 12), ")");
    session->Cancel(why);
    return PrefixFailed(absl::PermissionDeniedError(why));
  }
  if (!tail_.has_value()) {
    const absl::Span<const TokenId> prompt = Prompt();
    prefix_ids_.assign(prompt.begin(), prompt.end() - 1);
    // The last prompt token follows the rebuild layer by layer (model/layer_stepper.h).
    absl::StatusOr<LayerStepper> tail = LayerStepper::Start(
        *consumer_.model, prompt.last(1), static_cast<int64_t>(prefix_ids_.size()));
    if (!tail.ok()) return Fail(tail.status());
    tail_.emplace(*std::move(tail));
    decoder_.emplace(*consumer_.model, artifact);
  }
  // A takeover's session sends the layers not rebuilt yet.
  expected_chunks_ = ChunksFromLayer(planned_->chunks, progress_->layers_rebuilt());
  ReceiveOptions options;
  options.deadline = deadline_;
  options.stall_timeout = consumer_.transfer_timeout;
  options.cancellation = context_.cancellation;
  options.begin = cached_tokens_;
  options.tail = &*tail_;
  options.pacing.run = [scheduler = consumer_.scheduler](int64_t rows, int layers,
                                                         RebuildPacing::Piece work,
                                                         RebuildPacing::Done done) {
    scheduler->RunBetweenSteps(rows, layers, std::move(work), std::move(done));
  };
  options.post = [steps = consumer_.steps](std::function<void()> job) {
    steps->Run(std::move(job));
  };
  options.clock = clock_;
  options.progress = progress_;
  std::shared_ptr<TargetRun> self = shared_from_this();
  ReceiveIntoCache(std::move(session), *decoder_, planned_->plan, expected_chunks_, prefix_ids_,
                   &*cache_, std::move(options), [self](absl::StatusOr<ReceiveReport> report) {
                     self->Received(std::move(report));
                   });
}

void TargetRun::Received(absl::StatusOr<ReceiveReport> report) {
  if (!report.ok()) {
    // On the thread of the receive's last step (maybe the scheduler's): the fallback's prefill
    // allocates a cache, so it runs as a job.
    logits_ = report.status();
    return Post(&TargetRun::Rebuilt);
  }
  report_ = *std::move(report);
  std::shared_ptr<TargetRun> self = shared_from_this();
  consumer_.scheduler->RunBetweenSteps(
      1, 0,
      [self](int64_t, int64_t) {
        self->logits_ = self->tail_->LastLogits();
        return self->logits_.status();
      },
      [self](absl::Status status) {
        if (!status.ok()) {
          self->logits_ = std::move(status);
          return self->Post(&TargetRun::Rebuilt);  // a fallback's prefill: a job (see above)
        }
        // On the scheduler's thread, between its steps: the hand-over from here joins the
        // sequence at the scheduler's next step, with no wake-up of another thread on the way
        // (in a request's timeline, receive complete -> first token 0.3-0.55 -> ~0.19 ms).
        self->RunStep(&TargetRun::Rebuilt);
      });
}

void TargetRun::Rebuilt() {
  if (!logits_.ok()) return PrefixFailed(logits_.status());
  PrefixOutcome outcome = RouteOutcome();
  // A moved stream's next token is its first continued id: the scheduler prefills those on top
  // of the rebuilt prompt and samples after them; the tail's logits judge that first id.
  if (check_.has_value()) {
    if (absl::Status judged = check_->Judge(check_->first_position(), *logits_); !judged.ok()) {
      return Fail(std::move(judged));
    }
  }
  if (route_.continued == 0) outcome.first_logits = *std::move(logits_);
  outcome.tail = tail_->compute_time();
  outcome.payload_bytes = report_.bytes;
  outcome.transfer = report_.last_chunk - report_.first_chunk;
  outcome.rebuild = report_.rebuild;
  outcome.patch = report_.patch;
  outcome.last_rebuild = report_.last_rebuild;
  outcome.layer_rebuild = report_.layer_rebuild;
  outcome.lowered = report_.lowered;
  if (!outcome.lowered.empty()) absl::StrAppend(&outcome.reason, LoweredText(outcome.lowered));
  outcome.takeovers = takeovers_;
  if (takeovers_ > 0) {
    absl::StrAppend(&outcome.reason, "; the producer was lost: another took the transfer over (",
                    takeovers_, takeovers_ == 1 ? " takeover)" : " takeovers)");
  }
  Handover(std::move(outcome));
}

void TargetRun::PrefixFailed(const absl::Status& why) {
  if (AskTakeover(why)) return;
  if (!LocalFallbackAllowed(request_) || cancelled()) return Fail(why);
  *cache_ = consumer_.model->NewCache(cache_->capacity());  // drop what was half rebuilt
  PrefixOutcome outcome;
  outcome.mode = TransferMode::kLocal;
  // After a takeover asked for: why the transfer failed first, then why none took it over.
  outcome.reason =
      absl::StrCat("fallback: the ", TransferModeName(route_.mode), " transfer failed (",
                   (takeovers_ > 0 ? lost_ : why).ToString(), ")");
  if (takeovers_ > 0)
    absl::StrAppend(&outcome.reason, "; no producer took it over (", why.ToString(), ")");
  Handover(std::move(outcome));
}

bool TargetRun::AskTakeover(const absl::Status& why) {
  if (!context_.take_over || !planned_.has_value() || !may_ask_ ||
      takeovers_ >= consumer_.max_takeovers || cancelled() || !ProducerLost(why) ||
      clock_->Now() >= deadline_) {
    return false;
  }
  const int layers = static_cast<int>(planned_->plan.layers.size());
  const v1::GenerateEvent notice =
      TransferLostNotice(consumer_.name, takeovers_ + 1, progress_->layers_rebuilt(), layers,
                         cached_tokens_, Prompt().size(), planned_->chunks, why);
  absl::StatusOr<RunContext::Takeover> asked = context_.take_over(notice, context_.cancellation);
  if (!asked.ok()) return false;
  if (takeovers_ == 0) lost_ = why;
  ++takeovers_;
  may_ask_ = false;
  takeover_ = *std::move(asked);
  const absl::Time now = clock_->Now();
  give_up_ = std::min(deadline_, now + consumer_.takeover_wait);
  if (!takeover_.on_session) {
    Post(&TargetRun::Receive);
    return true;
  }
  std::shared_ptr<TargetRun> self = shared_from_this();
  takeover_.on_session(std::max(absl::ZeroDuration(), give_up_ - now),
                       [self] { self->Post(&TargetRun::Receive); });
  return true;
}

std::unique_ptr<SequenceStream> TargetRun::NewStream() {
  std::shared_ptr<TargetRun> self = shared_from_this();
  SequenceStream::Options stream_options;
  stream_options.target = consumer_.name;
  stream_options.tokenizer = consumer_.tokenizer;
  stream_options.stop_strings = options_.stop_strings;
  stream_options.top_logprobs = options_.top_logprobs;
  stream_options.on_prompt_done = [self](const KvCache& complete) { self->StorePrefix(complete); };
  if (check_.has_value()) {
    stream_options.on_prompt_logits = [self](int64_t first, const at::Tensor& logits) {
      return self->check_->Judge(first, logits);
    };
  }
  stream_options.on_event = emit_;
  stream_options.on_ended = [self](const SequenceEnd& end) { self->Ended(end); };
  return std::make_unique<SequenceStream>(std::move(stream_options), ids_,
                                          static_cast<size_t>(route_.continued));
}

void TargetRun::Fail(absl::Status status) {
  if (handed_over_ || !done_) return;
  stream_.reset();  // never handed over: its callbacks let go of the run
  takeover_ = {};   // its wait holds the request's cancellation
  emit_(ErrorEvent(consumer_.name, status));
  const RunDone done = std::move(done_);
  done_ = nullptr;
  done(std::move(status));
}

void TargetRun::StorePrefix(const KvCache& complete) {
  if (stored_ || !prefix_keys_.has_value()) return;
  stored_ = true;
  consumer_.prefix_cache->Store(*prefix_keys_, prefix_.cached_tokens, complete);
}

void TargetRun::Handover(PrefixOutcome prefix) {
  const int64_t prefix_tokens = static_cast<int64_t>(ids_.size()) - 1;
  if (prefix.mode != route_.mode && prefix_keys_.has_value()) {
    // A fallback's cache is local: its own scope.
    prefix_keys_ = consumer_.prefix_cache->KeysFor(
        ConsumerPrefixCache::RouteScope(TransferMode::kLocal, "", ""), request_.cache_salt(),
        absl::MakeConstSpan(ids_).first(static_cast<size_t>(prefix_tokens)));
  }
  prefix_ = std::move(prefix);
  // A prefix rebuilt from codes that arrived below the point's ranks is not what a later
  // request at this point would rebuild: never kept under its scope.
  if (!prefix_.lowered.empty()) prefix_keys_.reset();
  if (prefix_.mode != TransferMode::kLocal) StorePrefix(*cache_);  // rebuilt
  if (prefix_.mode != route_.mode && context_.on_fallback) {
    context_.on_fallback(FallbackNotice(started_, prefix_));  // announced before it runs
  }
  // The scheduler prefills what is left (local) and decodes; the stream hands its events over
  // on the scheduler's thread, and its end finishes the target (Ended).
  if (stream_ == nullptr) stream_ = NewStream();
  SequenceRequest sequence{
      ids_,
      *std::move(cache_),
      prefix_.first_logits,
      options_,
      deadline_,
      context_.cancellation != nullptr ? context_.cancellation->flag() : nullptr,
      stream_.get()};
  if (check_.has_value()) {  // the received ids' positions this prefill runs
    sequence.prompt_logits_from = std::max(check_->first_position(), sequence.cache.length());
  }
  handed_over_ = true;
  if (absl::Status submitted = consumer_.scheduler->Submit(std::move(sequence)); !submitted.ok()) {
    handed_over_ = false;  // refused: never handed over
    stream_.reset();       // lets go of the run its callbacks held
    Fail(submitted);
  }
}

void TargetRun::Ended(const SequenceEnd& end) {
  absl::Status status = EndError(end, deadline_ - context_.received);
  if (status.ok()) {
    v1::GenerateEvent finished;
    finished.set_target(consumer_.name);
    // A continued stream's replayed outputs count as output, once, and not as prompt.
    const size_t continued = static_cast<size_t>(route_.continued);
    v1::Finished& f = *finished.mutable_finished();
    f = FinishedOf(prefix_, end, ids_.size() - continued, start_, stream_->first_token(),
                   context_.received, clock_->Now());
    f.set_output_tokens(f.output_tokens() + static_cast<uint32_t>(continued));
    if (check_.has_value()) *f.mutable_continuation() = check_->tally();
    emit_(finished);
  } else {
    emit_(ErrorEvent(consumer_.name, status));
  }
  const RunDone done = std::move(done_);
  done_ = nullptr;
  takeover_ = {};  // its wait holds the request's cancellation
  // The stream's last act (SequenceStream::Options::on_ended): its callbacks let go of the run;
  // the copy of on_ended running holds it until this returns.
  stream_.reset();
  done(std::move(status));
}

}  // namespace

void StartTarget(const ConsumerModel& consumer, const v1::GenerateRequest& request,
                 const TargetRoute& route_in, RunContext context, EventSink emit, RunDone done) {
  auto fail = [&](absl::Status status) {
    emit(ErrorEvent(consumer.name, status));
    done(std::move(status));
  };
  absl::StatusOr<std::vector<TokenId>> ids =
      context.prompt_ids.has_value() ? *context.prompt_ids : PromptIds(consumer, request);
  if (!ids.ok()) return fail(ids.status());
  absl::StatusOr<GenerationOptions> options = GenerationOptionsFor(consumer, request);
  if (!options.ok()) return fail(options.status());
  if (route_in.continued > 0) {  // checked by ContinueStream; its outputs were streamed already
    if (route_in.continued >= options->max_tokens ||
        route_in.continued >= static_cast<int64_t>(ids->size())) {
      return fail(
          absl::InvalidArgumentError("continued_ids: as many as max_tokens allows, or more"));
    }
    options->max_tokens -= static_cast<int>(route_in.continued);
  }
  if (consumer.scheduler == nullptr || consumer.steps == nullptr) {
    return fail(absl::InternalError("the consumer has no decode scheduler or step queue"));
  }
  TargetRoute route = route_in;
  if (route.mode != TransferMode::kLocal &&
      ids->size() - static_cast<size_t>(route_in.continued) < 2) {
    route = TargetRoute{};
    route.mode_reason = "a 1-token prompt has no prefix to transfer";
    route.continued = route_in.continued;
  }
  std::make_shared<TargetRun>(consumer, request, std::move(route), *std::move(ids),
                              *std::move(options), std::move(context), std::move(emit),
                              std::move(done))
      ->Start();
}

}  // namespace scd::consumer
