#include "coordinator/routed_request.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/change_notice.h"
#include "base/log_text.h"
#include "base/random_id.h"
#include "base/release_clock.h"
#include "codec/transfer_mode.h"
#include "coordinator/producer_takeover.h"
#include "proto/frontier_proto.h"
#include "proto/request_validation.h"
#include "proto/session_tag.h"
#include "proto/wire_mode.h"

namespace scd::coordinator {
namespace {

// A call's end that says its node is gone rather than that it refused or failed the request:
// the connection failed or broke (UNAVAILABLE), or the node's server cancelled it (CANCELLED when
// the coordinator did not cancel it: the caller checks).
bool Unreachable(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::UNAVAILABLE ||
         status.error_code() == grpc::StatusCode::CANCELLED;
}

// A moved stream's codes are the ones it began from: the same artifact's point as `from` had,
// at its ranks (no lowering in flight, which would rebuild a different prompt).
void KeepPoint(const RouteTarget& from, RouteTarget* to) {
  if (to->artifact_id == from.artifact_id) to->point = from.point;
  to->deliver_by_us = 0;
  to->planned_goodput_bytes_per_s = 0;
}

// A moved or resumed stream's ids so far and how they were decoded (DecodeRequest.continued_ids,
// continued_mode); nothing for a stream with none.
void SetContinued(const TargetForwarder& forward, v1::DecodeRequest* decode) {
  if (forward.streamed_ids().empty()) return;
  for (int32_t id : forward.streamed_ids()) decode->add_continued_ids(id);
  decode->set_continued_mode(forward.decoded_locally() ? v1::TRANSFER_MODE_LOCAL
                                                       : v1::TRANSFER_MODE_UNSPECIFIED);
}

}  // namespace

// One target's Decode call on its consumer: a reactor whose reads the request's state drives.
class RoutedRequest::TargetCall final : public grpc::ClientReadReactor<v1::GenerateEvent> {
 public:
  TargetCall(RoutedRequest* request, size_t index)
      : forward(&request->route_, index, request->deps_.registry), request_(request) {}
  // A moved stream's next call: `from`'s forwarder goes on at `route`'s only target (the call
  // holds the route and its load on the registry until it is deleted).
  TargetCall(RoutedRequest* request, const TargetForwarder& from, Route route)
      : forward(from), request_(request), own_route_(std::make_unique<Route>(std::move(route))) {
    request->deps_.registry->NoteRouted(*own_route_, nullptr);
  }
  ~TargetCall() override {
    if (own_route_ != nullptr) request_->deps_.registry->RoutedDone(*own_route_);
  }
  const Route* own_route() const { return own_route_.get(); }

  void Begin(v1::DecodeRequest decode, std::unique_ptr<v1::Consumer::Stub> stub) {
    decode_ = std::move(decode);
    stub_ = std::move(stub);
    stub_->async()->Decode(&context, &decode_, this);
    StartRead(&event);
    StartCall();
  }
  void Read() { StartRead(&event); }
  // While no read is under way outside a reaction (parked, paused), the call is held open: gRPC
  // would otherwise end it (OnDone) with events unread.
  void HoldOpen() {
    if (!held_) AddHold();
    held_ = true;
  }
  void LetEnd() {
    if (held_) RemoveHold();
    held_ = false;
  }
  const RouteTarget& target() const { return forward.target(); }

  // Under the request's mutex.
  TargetForwarder forward;
  v1::GenerateEvent event;  // the event read (or parked)
  bool ended = false;       // the call is over (`status` says how)
  bool parked = false;      // `event` waits for the producer's answer
  bool paused = false;      // waits for room in the client's stream
  std::string failure;      // why the coordinator gave up on it (for the Error it writes)
  // The producer, which answered, failed this target alone as UNAVAILABLE: its transfer lost the
  // consumer (a frozen or dead node, a cut link), so the node is suspect, not the producer.
  bool consumer_lost = false;
  // A retryable Error held back while the stream tries to move (written if it cannot).
  std::optional<v1::GenerateEvent> held_error;
  // A moved call in a transfer mode: the session its codes travel under (its own Prefill, asked
  // once its Started came: StartMovedPrefill).
  std::string session_id;
  // Takeovers of its transfer (OnTransferLost): the producers lost so far (never asked again)
  // and the last one asked (once one was, the failed target's grace leaves the call alone: a
  // failed takeover is told to the consumer, which then falls back or ends the target).
  std::set<std::string> lost_producers;
  std::string takeover_node;
  grpc::Status status;
  grpc::ClientContext context;

 private:
  void OnReadDone(bool ok) override {
    if (ok)
      request_->Locked([this] {
        if (request_->OnEvent(this)) request_->ReadOn(this);
      });
  }
  void OnDone(const grpc::Status& status) override { request_->OnTargetDone(this, status); }

  RoutedRequest* const request_;
  std::unique_ptr<Route> own_route_;  // a moved call's (null: the request's route)
  bool held_ = false;  // under the request's mutex
  v1::DecodeRequest decode_;
  std::unique_ptr<v1::Consumer::Stub> stub_;
};

// The request's share of its service: the route's load on the registry, one in the active count.
class RoutedRequest::Lease {
 public:
  Lease(const RoutedRequestDeps& deps, const Route& route, const PrefixHint* hint)
      : registry_(deps.registry), active_(deps.active), route_(route) {
    registry_->NoteRouted(route_, hint);
    if (active_ != nullptr) ++*active_;
    NoteChange();
  }
  ~Lease() {
    registry_->RoutedDone(route_);
    if (active_ != nullptr) --*active_;
    NoteRelease();
  }
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;

 private:
  NodeRegistry* const registry_;
  std::atomic<uint32_t>* const active_;
  const Route& route_;
};

// The producer's Prefill while it runs.
struct RoutedRequest::PrefillCall {
  std::unique_ptr<grpc::ClientContext> context;
  std::unique_ptr<v1::Producer::Stub> stub;
  v1::PrefillRequest request;
  v1::PrefillResponse response;
  std::map<std::string, TargetCall*> by_target;
};

RoutedRequest::RoutedRequest(RoutedRequestDeps deps, v1::GenerateRequest req, Route route,
                             const PrefixHint* hint, absl::Time deadline,
                             grpc::CallbackServerContext* context, Ended ended)
    : EventStream(kEventsQueued, std::move(ended)),
      deps_(std::move(deps)),
      req_(std::move(req)),
      route_(std::move(route)),
      id_(ForLog(req_.request_id(), 40)),
      session_id_(RandomId128()),
      routed_at_(deps_.registry->clock()->Now()),
      deadline_(deadline),
      early_prefill_(EarlyPrefill(deps_, route_)),
      declined_session_id_(EarlyDeclinedSessionId(session_id_)),
      context_(context),
      lease_(std::make_unique<Lease>(deps_, route_, hint)) {
  metrics_.emplace(deps_.metrics);
  for (size_t i = 0; i < route_.targets.size(); ++i) {
    calls_.push_back(std::make_unique<TargetCall>(this, i));
    calls_.back()->context.set_deadline(absl::ToChronoTime(deadline_));
  }
  cancel_calls_ = cancellation().OnCancel([this](const absl::Status&) {
    std::vector<grpc::ClientContext*> contexts;
    {
      absl::MutexLock lock(&calls_mu_);
      for (auto& call : calls_) contexts.push_back(&call->context);
    }
    for (grpc::ClientContext* context : contexts) context->TryCancel();
  });
}

RoutedRequest::~RoutedRequest() { cancel_calls_.Reset(); }

void RoutedRequest::Resume(std::vector<int32_t> received, TransferMode started) {
  absl::MutexLock lock(&mu_);
  calls_.front()->forward.Resume(
      std::move(received), started,
      "resumed through this coordinator: the client's coordinator went away");
}

void RoutedRequest::Start() {
  // Held while this runs: a client gone at once ends the call, and an early Prefill may answer
  // (cancelled) before the targets' calls hold the request.
  Hold();
  // Early: the Prefill goes first -- the producer's pass is the longer road to the first token,
  // and a session that reaches the consumer before the Decode waits there for it.
  if (early_prefill_) Locked([this] { StartPrefill(); });
  for (auto& owned : calls_) {
    TargetCall* call = owned.get();
    const RouteTarget& target = call->target();
    v1::DecodeRequest decode;
    *decode.mutable_request() = req_;
    decode.set_target(target.target);
    SetTargetMode(target.mode, &decode);
    decode.set_mode_reason(target.mode_reason);
    decode.set_producer(route_.producer_name);
    decode.set_producer_fingerprint(route_.producer_fingerprint);
    decode.set_artifact_id(target.artifact_id);
    decode.set_session_id(session_id_);
    decode.set_early_prefill(early_prefill_);
    if (target.point) {
      *decode.mutable_point() = CodePointToProto(*target.point);
      decode.set_expected_kl(target.point->kl);
    }
    // A resumed stream's ids so far (Resume; none otherwise).
    SetContinued(call->forward, &decode);
    deps_.secret->Attach(&call->context);
    Hold();  // released in the call's OnDone
    call->Begin(std::move(decode), v1::Consumer::NewStub(deps_.channel(target.consumer_address)));
  }
  Release();
}

bool RoutedRequest::EarlyPrefill(const RoutedRequestDeps& deps, const Route& route) {
  // One target: a fan-out's Prefill waits for every Started (one refusal must not cancel the
  // codes of the others).
  return deps.early_prefill && route.targets.size() == 1 &&
         route.targets.front().mode != TransferMode::kLocal &&
         route.targets.front().consumer_cached_tokens == 0 && !route.producer_address.empty();
}

template <typename F>
void RoutedRequest::Locked(F&& f) {
  std::optional<grpc::Status> end;
  std::pair<Clock::TimerId, Clock::TimerId> timers;  // the timers set (0: none)
  std::vector<TargetCall*> moved;
  {
    absl::MutexLock lock(&mu_);
    f();
    Advance();
    moved = std::exchange(to_begin_, {});
    end = std::exchange(end_due_, std::nullopt);
    timers = {producer_wait_, grace_};
    if (end.has_value()) {  // nothing more is written: the request's share ends with the call
      metrics_.reset();
      lease_.reset();
    }
  }
  BeginMoved(std::move(moved));
  // Outside the lock: ending the call may run its OnDone on this thread.
  if (end.has_value()) {
    CancelTimer(timers.first);
    CancelTimer(timers.second);
    End(*std::move(end));
  }
}

void RoutedRequest::Write(const v1::GenerateEvent& event) {
  if (metrics_.has_value()) metrics_->Observe(event);
  if (!Push(event)) full_ = true;
}

void RoutedRequest::ReadOn(TargetCall* call) {
  if (full_) {
    call->paused = true;
    call->HoldOpen();
  } else {
    call->Read();
    call->LetEnd();
  }
}

void RoutedRequest::OnRoom() {
  Locked([this] {
    full_ = false;
    for (auto& call : calls_) {
      if (call->paused) {
        call->paused = false;
        ReadOn(call.get());
      }
    }
  });
}

bool RoutedRequest::OnEvent(TargetCall* call) {
  if (call->event.has_transfer_lost()) {  // the control plane's: never forwarded
    OnTransferLost(call, call->event.transfer_lost());
    return true;
  }
  if (call->event.has_error() && call->forward.started() && MayMove(call)) {
    const auto code = static_cast<grpc::StatusCode>(call->event.error().code());
    if (code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::ABORTED) {
      // Retryable: held back while the stream moves once the call ends (next).
      call->held_error = call->event;
      return true;
    }
  }
  if (call->forward.NeedsProducer(call->event) && !producer_.known) {
    // The producer's Prefill answer normally precedes the consumer's Finished (it returns at the
    // transfer's ack); a late one is not waited for long.
    call->parked = true;
    call->HoldOpen();
    if (producer_wait_ == 0) {
      producer_wait_ =
          SetTimer(clock()->Now() + deps_.producer_answer_wait, [this] { ReleaseParked(); });
    }
    return false;
  }
  const bool moved_start = call->event.has_started() && call->forward.move_pending();
  const bool forwarded = call->forward.Rewrite(producer_, &call->event);
  if (forwarded && call->event.has_started() && deps_.resume_token) {
    call->event.mutable_started()->set_resume_token(
        deps_.resume_token(req_, call->forward.started_mode(), call->target().target));
  }
  if (forwarded) Write(call->event);
  if (moved_start && !call->session_id.empty() &&
      call->forward.started_mode() != TransferMode::kLocal) {
    StartMovedPrefill(call);
  }
  return true;
}

void RoutedRequest::ReleaseParked() {
  for (auto& owned : calls_) {
    TargetCall* call = owned.get();
    if (!call->parked) continue;
    call->parked = false;
    if (call->forward.Rewrite(producer_, &call->event)) Write(call->event);
    if (!call->ended) {
      ReadOn(call);
    } else if (!call->forward.terminal()) {
      EndWithoutTerminal(call);
    }
  }
}

void RoutedRequest::OnTargetDone(TargetCall* call, const grpc::Status& status) {
  Locked([&] {
    call->ended = true;
    call->status = status;
    // A call the node did not end on purpose (its process or link gone, its server stopped): the
    // node is out of routing here until its probe passes (coordinator/node_ejection.h).
    // UNAVAILABLE says so even when the producer failed the target first (it could not reach
    // the node either: a frozen consumer); a CANCELLED call after such a failure is the
    // coordinator's own doing.
    const bool node_gone = status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                           (Unreachable(status) && call->failure.empty());
    if (node_gone && !cancelled()) {
      deps_.registry->NoteUnreachable(
          call->target().consumer_node,
          absl::StrCat("its Decode call failed: ", status.error_message()));
    }
    if (call->forward.terminal() || call->parked) return;  // a parked one: forwarded when released
    if (!call->forward.started()) {
      // Its node gone before the Started (refused, reset, draining): the target goes to another
      // replica as a move would (the client sees that replica's Started). Any other refusal:
      // Advance decides (the whole call's status, or an Error).
      if (node_gone && MayMove(call)) {
        Move(call, absl::StrCat("its call ended before it started: ", status.error_message()));
      }
      return;
    }
    // Ended without a terminal event the coordinator caused (a consumer that died or went away),
    // or with a retryable Error held back: the stream moves if it may. A node gone moves its
    // stream even when the producer failed the target first: it could not reach the node either
    // (a killed replica refuses the producer's connection before its own call ends).
    const bool movable = call->held_error.has_value() ||
                         ((call->failure.empty() || node_gone) &&
                          status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED);
    if (movable && AllStreamed(call)) {
      EndStreamed(call);
      return;
    }
    if (movable && MayMove(call)) {
      const std::string reason =
          call->held_error.has_value()
              ? absl::StrCat("its Error: ", call->held_error->error().message())
              : absl::StrCat("its call ended: ",
                             status.ok() ? "without a result" : status.error_message());
      if (Move(call, reason)) return;
    }
    if (call->held_error.has_value()) {
      call->event = *std::exchange(call->held_error, std::nullopt);
      if (call->forward.Rewrite(producer_, &call->event)) Write(call->event);
      return;
    }
    EndWithoutTerminal(call);
  });
  Release();
}

bool RoutedRequest::AllStreamed(const TargetCall* call) const {
  return !cancelled() && req_.max_tokens() > 0 &&
         call->forward.streamed_ids().size() >= req_.max_tokens();
}

v1::GenerateEvent FinishedAfterLastToken(const v1::GenerateRequest& request,
                                         const std::string& target, size_t output_tokens,
                                         TransferMode mode, uint32_t moves, std::string why) {
  v1::GenerateEvent event;
  event.set_target(target);
  v1::Finished* finished = event.mutable_finished();
  finished->set_reason("length");
  // The prompt as the coordinator holds it (ids once its front tokenized a text prompt; a text
  // prompt it did not tokenize counts 0).
  finished->set_prompt_tokens(static_cast<uint32_t>(request.prompt_ids_size()));
  finished->set_output_tokens(static_cast<uint32_t>(output_tokens));
  SetRanMode(mode, finished);
  finished->set_mode_reason(std::move(why));
  finished->set_moves(moves);
  return event;
}

void RoutedRequest::EndStreamed(TargetCall* call) {
  call->held_error.reset();
  call->forward.set_terminal();
  spdlog::info("[{}] target {} on {} lost after its last token: finished here", id_,
               call->target().target, call->target().consumer_node);
  Write(FinishedAfterLastToken(
      req_, call->target().target, call->forward.streamed_ids().size(),
      call->forward.started_mode(), call->forward.moves(),
      "its consumer was lost after streaming every token (max_tokens) but before its Finished"));
}

bool RoutedRequest::MayMove(const TargetCall* call) const {
  const uint32_t limit = req_.has_migration_limit()
                             ? std::min(req_.migration_limit(), deps_.migration_limit)
                             : deps_.migration_limit;
  return !call->forward.terminal() && !call->parked && call->forward.moves() < limit &&
         !cancelled() && clock()->Now() < deadline_;
}

bool RoutedRequest::Move(TargetCall* call, const std::string& reason) {
  const RouteTarget& from = call->target();
  given_up_.insert(from.consumer_node);
  if (!call->forward.started() && Early() && prefill_ != nullptr) {
    // The early Prefill streams to the node given up: its codes are unwanted (the new replica
    // prefills locally); cancelled, it settles as a Prefill refused before the Started would.
    prefill_->context->TryCancel();
  }
  const MoveConstraint constraint{given_up_, from.consumer_fingerprint};
  absl::StatusOr<Route> route = absl::UnavailableError("not resolved");
  // A stream that began from codes goes on from codes where a producer can send them: the new
  // replica rebuilds the prompt as the first did and prefills the streamed tokens on top, so a
  // greedy stream continues with the tokens it would have given (local prefill of the prompt
  // would give the consumer's own, different cache).
  const TransferMode codes = call->forward.started() && !call->forward.fell_back()
                                 ? call->forward.started_mode()
                                 : TransferMode::kLocal;
  if (codes != TransferMode::kLocal) {
    route = deps_.registry->ResolveMove(from.target, constraint, codes);
    if (route.ok()) KeepPoint(from, &route->targets.front());
  }
  if (!route.ok() || route->targets.front().mode == TransferMode::kLocal) {
    route = deps_.registry->ResolveMove(from.target, constraint);
  }
  if (!route.ok()) {
    spdlog::info("[{}] target {} on {} lost ({}); not moved: {}", id_, from.target,
                 from.consumer_node, ForLog(reason, 300), std::string(route.status().message()));
    return false;
  }
  auto next = std::make_unique<TargetCall>(this, call->forward, *std::move(route));
  next->forward.MoveTo(next->own_route(), 0, from.consumer_node, reason);
  next->context.set_deadline(absl::ToChronoTime(deadline_));
  if (next->target().mode != TransferMode::kLocal) next->session_id = RandomId128();
  TargetCall* const started = next.get();
  spdlog::info("[{}] target {} moves from {} to {} after {} tokens ({}, move {})", id_, from.target,
               from.consumer_node, started->target().consumer_node,
               call->forward.streamed_ids().size(), ForLog(reason, 300), started->forward.moves());
  {
    absl::MutexLock lock(&calls_mu_);
    for (auto& slot : calls_) {
      if (slot.get() != call) continue;
      retired_calls_.push_back(std::exchange(slot, std::move(next)));
      break;
    }
    // Cancelled since MayMove: its callback may have read the calls before this one joined.
    if (cancelled()) started->context.TryCancel();
  }
  to_begin_.push_back(started);
  return true;
}

void RoutedRequest::BeginMoved(std::vector<TargetCall*> calls) {
  for (TargetCall* call : calls) {
    const RouteTarget& target = call->target();
    v1::DecodeRequest decode;
    *decode.mutable_request() = req_;
    decode.set_target(target.target);
    SetTargetMode(target.mode, &decode);
    if (target.mode == TransferMode::kLocal) {
      decode.set_mode_reason(absl::StrCat("moved to this replica (move ", call->forward.moves(),
                                          "): local prefill of the prompt and the tokens so far"));
    } else {
      decode.set_mode_reason(absl::StrCat("moved to this replica (move ", call->forward.moves(),
                                          "): ", TransferModeName(target.mode),
                                          " codes for the prompt, the tokens so far prefilled"));
      decode.set_producer(call->own_route()->producer_name);
      decode.set_producer_fingerprint(call->own_route()->producer_fingerprint);
      decode.set_artifact_id(target.artifact_id);
      decode.set_session_id(call->session_id);
      if (target.point) {
        *decode.mutable_point() = CodePointToProto(*target.point);
        decode.set_expected_kl(target.point->kl);
      }
    }
    SetContinued(call->forward, &decode);
    deps_.secret->Attach(&call->context);
    Hold();  // released in the call's OnDone
    // A request cancelled meanwhile has cancelled this call's context too (calls_mu_).
    call->Begin(std::move(decode), v1::Consumer::NewStub(deps_.channel(target.consumer_address)));
  }
}

void RoutedRequest::Advance() {
  if (phase_ == Phase::kStarting) {
    if (!std::all_of(calls_.begin(), calls_.end(),
                     [](const auto& c) { return c->forward.started() || c->ended; })) {
      return;
    }
    EndStarting();
  }
  if (phase_ != Phase::kSettled || ended_) return;
  if (std::all_of(calls_.begin(), calls_.end(),
                  [](const auto& c) { return c->ended && !c->parked; })) {
    ended_ = true;
    spdlog::info("[{}] done ({} targets)", id_, calls_.size());
    end_due_ = grpc::Status::OK;
  }
}

void RoutedRequest::EndWithoutTerminal(TargetCall* call) {
  call->forward.set_terminal();
  const grpc::Status& status = call->status;
  v1::GenerateEvent error;
  error.set_target(call->target().target);
  const bool quiet = status.ok() || status.error_code() == grpc::StatusCode::CANCELLED;
  grpc::StatusCode code =
      quiet && !call->failure.empty() ? grpc::StatusCode::UNAVAILABLE : status.error_code();
  std::string message =
      !call->failure.empty()
          ? call->failure
          : absl::StrCat("consumer ", call->target().target, " at ",
                         call->target().consumer_address, ": ",
                         status.ok() ? "ended without a result" : status.error_message());
  // Past the request's deadline, whichever part noticed first (the consumer's call, the
  // producer's session failing the target), the deadline is why it ended.
  if (clock()->Now() >= deadline_ && (quiet || code == grpc::StatusCode::UNAVAILABLE ||
                                      code == grpc::StatusCode::DEADLINE_EXCEEDED)) {
    code = grpc::StatusCode::DEADLINE_EXCEEDED;
    message = absl::StrCat("the request's deadline passed (", message, ")");
  }
  error.mutable_error()->set_code(static_cast<int>(code));
  error.mutable_error()->set_message(message);
  Write(error);
}

void RoutedRequest::EndStarting() {
  if (std::optional<grpc::Status> refused = Refusal(); refused.has_value()) {
    spdlog::info("[{}] refused by the consumers: {}", id_, ForLog(refused->error_message(), 300));
    if (prefill_ != nullptr) prefill_->context->TryCancel();  // an early one: its codes unwanted
    phase_ = Phase::kSettled;
    ended_ = true;
    end_due_ = *std::move(refused);
    return;
  }
  if (!early_prefill_) {
    phase_ = Phase::kPrefill;
    StartPrefill();
    return;
  }
  if (std::any_of(calls_.begin(), calls_.end(),
                  [](const auto& c) { return c->forward.early_declined(); })) {
    // The consumer queued the request and refused the early session: the producer is asked
    // now, as without early prefill, under the declined session id.
    spdlog::info("[{}] the consumer declined the early prefill (queued); asking the producer now",
                 id_);
    early_declined_ = true;
    if (prefill_ != nullptr) {
      prefill_->context->TryCancel();
      retired_prefill_ = std::move(prefill_);
    }
    producer_ = ProducerOutcome{};
    failed_early_.clear();
    for (auto& call : calls_) call->failure.clear();  // what the retired Prefill said
    phase_ = Phase::kPrefill;
    StartPrefill();
    return;
  }
  // Early: the Prefill runs already, or answered while targets were starting.
  phase_ = producer_.known ? Phase::kSettled : Phase::kPrefill;
  Settle(std::exchange(failed_early_, {}));
}

std::optional<grpc::Status> RoutedRequest::Refusal() {
  if (std::any_of(calls_.begin(), calls_.end(),
                  [](const auto& c) { return c->forward.started(); })) {
    for (auto& call : calls_) {
      if (call->ended && !call->forward.terminal()) EndWithoutTerminal(call.get());
    }
    return std::nullopt;
  }
  // Every target refused before starting (its consumer's own checks, full, gone): the request
  // is refused as a whole, with the first refusal's status and no event.
  grpc::Status refused = calls_.front()->status;
  if (refused.ok()) {
    refused = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                           absl::StrCat("consumer ", calls_.front()->target().target,
                                        " ended the request without starting it"));
  }
  for (auto& call : calls_) call->forward.set_terminal();
  return refused;
}

void RoutedRequest::StartPrefill() {
  auto prefill = std::make_unique<PrefillCall>();
  *prefill->request.mutable_request() = req_;
  prefill->request.set_session_id(PrefillSessionId());
  for (auto& call : calls_) {
    const TargetForwarder& f = call->forward;
    const RouteTarget& route = call->target();
    // Early: as routed (the consumer will load no cached positions); else as its Started said.
    const TransferMode mode = Early() ? route.mode : f.started_mode();
    if (!Early() &&
        (!f.started() || call->ended || f.fell_back() || mode == TransferMode::kLocal)) {
      continue;
    }
    v1::PrefillTarget* target = prefill->request.add_targets();
    target->set_target(route.target);
    target->set_transfer_address(route.transfer_address);
    target->set_consumer_fingerprint(route.consumer_fingerprint);
    SetTargetMode(mode, target);
    target->set_artifact_id(route.artifact_id);
    target->set_consumer_cached_tokens(Early() ? 0 : f.consumer_cached_tokens());
    if (route.point) *target->mutable_point() = CodePointToProto(*route.point);
    if (route.deliver_by_us > 0 && !req_.keep_ranks()) {
      // The codes' delivery deadline, from now: what the choice's prediction left of it.
      const double left_us =
          route.deliver_by_us - absl::ToDoubleMicroseconds(clock()->Now() - routed_at_);
      target->set_adapt_within_us(static_cast<uint64_t>(std::max(1.0, left_us)));
      target->set_planned_goodput_bytes_per_s(route.planned_goodput_bytes_per_s);
    }
    prefill->by_target[route.target] = call.get();
  }
  if (prefill->by_target.empty()) {
    producer_.known = true;
    phase_ = Phase::kSettled;
    return;
  }
  // A child of the client's call: a client that goes away cancels the prefill (and so every
  // session it streams) while it runs, not after.
  prefill->context = grpc::ClientContext::FromCallbackServerContext(*context_);
  prefill->context->set_deadline(absl::ToChronoTime(deadline_));
  deps_.secret->Attach(prefill->context.get());
  prefill->stub = v1::Producer::NewStub(deps_.channel(route_.producer_address));
  prefill_ = std::move(prefill);
  Hold();  // released when it answers
  const PrefillCall* const call = prefill_.get();
  prefill_->stub->async()->Prefill(prefill_->context.get(), &prefill_->request, &prefill_->response,
                                   [this, call](grpc::Status status) {
                                     OnPrefillDone(call, status);
                                     Release();
                                   });
}

void RoutedRequest::StartMovedPrefill(TargetCall* call) {
  StartTargetPrefill(
      call, call->session_id, call->own_route()->producer_address,
      call->forward.consumer_cached_tokens(), 0,
      [this, call](const PrefillCall& prefill, const grpc::Status& status)
          ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { OnMovedPrefillDone(prefill, call, status); });
}

void RoutedRequest::StartTargetPrefill(
    TargetCall* call, const std::string& session_id, const std::string& address,
    uint32_t cached_tokens, uint32_t layer_begin,
    std::function<void(const PrefillCall&, const grpc::Status&)> done) {
  const RouteTarget& route = call->target();
  auto prefill = std::make_unique<PrefillCall>();
  *prefill->request.mutable_request() = req_;
  prefill->request.set_session_id(session_id);
  v1::PrefillTarget* target = prefill->request.add_targets();
  target->set_target(route.target);
  target->set_transfer_address(route.transfer_address);
  target->set_consumer_fingerprint(route.consumer_fingerprint);
  SetTargetMode(call->forward.started_mode(), target);
  target->set_artifact_id(route.artifact_id);
  target->set_consumer_cached_tokens(cached_tokens);
  target->set_layer_begin(layer_begin);
  if (route.point) *target->mutable_point() = CodePointToProto(*route.point);
  prefill->by_target[route.target] = call;
  // A child of the client's call, as the first Prefill.
  prefill->context = grpc::ClientContext::FromCallbackServerContext(*context_);
  prefill->context->set_deadline(absl::ToChronoTime(deadline_));
  deps_.secret->Attach(prefill->context.get());
  prefill->stub = v1::Producer::NewStub(deps_.channel(address));
  PrefillCall* const started = prefill.get();
  moved_prefills_.push_back(std::move(prefill));
  Hold();  // released when it answers
  started->stub->async()->Prefill(started->context.get(), &started->request, &started->response,
                                  [this, started, done = std::move(done)](grpc::Status status) {
                                    Locked([&] { done(*started, status); });
                                    Release();
                                  });
}

void RoutedRequest::OnTransferLost(TargetCall* call, const v1::TransferLost& lost) {
  if (call->ended || call->forward.terminal() || cancelled() || lost.session_id().empty()) return;
  const RouteTarget& target = call->target();
  const Route& route = call->own_route() != nullptr ? *call->own_route() : route_;
  const std::string session_id = TakeoverSessionId(lost.session_id(), lost.takeover());
  call->lost_producers.insert(route.producer_node);
  if (!call->takeover_node.empty()) call->lost_producers.insert(call->takeover_node);
  absl::StatusOr<TakeoverCandidate> candidate = deps_.registry->ResolveTakeover(
      target.consumer_node, route.producer_fingerprint, call->lost_producers);
  std::string why;
  if (candidate.ok()) {
    candidate->inputs.prompt_tokens = lost.prompt_tokens();
    const TakeoverDecision decision =
        ChooseTakeover(candidate->inputs, lost, LocalFallbackAllowed(req_));
    spdlog::info("[{}] target {}'s transfer lost its producer ({} of {} layers rebuilt): {}{}", id_,
                 target.target, lost.layers_rebuilt(), lost.layers(),
                 decision.take_over ? "taken over by " : "not taken over: ",
                 decision.take_over ? absl::StrCat(candidate->name, " (", candidate->node_id,
                                                   "): ", decision.reason)
                                    : decision.reason);
    if (decision.take_over) {
      call->takeover_node = candidate->node_id;
      const std::string producer = candidate->node_id;
      StartTargetPrefill(
          call, session_id, candidate->address, static_cast<uint32_t>(lost.token_begin()),
          lost.layers_rebuilt(),
          [this, call, producer, session_id](const PrefillCall& prefill, const grpc::Status& status)
              ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                OnTakeoverDone(prefill, call, producer, session_id, status);
              });
      return;
    }
    why = decision.reason;
  } else {
    why = std::string(candidate.status().message());
    spdlog::info("[{}] target {}'s transfer lost its producer; not taken over: {}", id_,
                 target.target, why);
  }
  // Told at once: the consumer falls back (or ends the target) without waiting for its bound.
  deps_.tell_failed(target, session_id, absl::StrCat("no takeover: ", why));
}

void RoutedRequest::OnTakeoverDone(const PrefillCall& prefill, TargetCall* call,
                                   const std::string& producer, const std::string& session_id,
                                   const grpc::Status& status) {
  std::string failure;
  if (!status.ok())
    failure = absl::StrCat("the takeover's producer failed: ", status.error_message());
  for (const v1::PrefillOutcome& outcome : prefill.response.outcomes()) {
    if (outcome.code() != 0 && failure.empty()) {
      failure = absl::StrCat("the takeover's producer: ", outcome.message());
    }
  }
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE && !cancelled() && !ended_) {
    deps_.registry->NoteUnreachable(
        producer, absl::StrCat("its Prefill call failed: ", status.error_message()));
  }
  spdlog::info("[{}] target {}'s takeover on {}: {}", id_, call->target().target, producer,
               failure.empty() ? "ok" : ForLog(failure, 300));
  if (failure.empty() || call->ended || call->forward.terminal() || cancelled()) return;
  deps_.tell_failed(call->target(), session_id, failure);
}

void RoutedRequest::OnMovedPrefillDone(const PrefillCall& prefill, TargetCall* call,
                                       const grpc::Status& status) {
  const Route& moved = *call->own_route();
  std::string failure;
  if (!status.ok()) {
    failure = absl::StrCat("producer ", moved.producer_name, " at ", moved.producer_address,
                           " failed: ", status.error_message());
  }
  for (const v1::PrefillOutcome& outcome : prefill.response.outcomes()) {
    if (outcome.code() != 0 && failure.empty()) {
      failure = absl::StrCat("producer ", moved.producer_name, ": ", outcome.message());
    }
  }
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE && !cancelled() && !ended_) {
    deps_.registry->NoteUnreachable(
        moved.producer_node, absl::StrCat("its Prefill call failed: ", status.error_message()));
  }
  spdlog::info("[{}] moved target {}'s prefill on {}: {}", id_, call->target().target,
               moved.producer_name, failure.empty() ? "ok" : ForLog(failure, 300));
  if (failure.empty() || call->ended || call->forward.terminal() || cancelled()) return;
  // Its consumer cannot tell a dead producer from a slow one: told, it prefills by itself (or
  // ends the target, as the request asks).
  deps_.tell_failed(call->target(), call->session_id, failure);
}

void RoutedRequest::OnPrefillDone(const PrefillCall* call, const grpc::Status& status) {
  Locked([&] {
    if (call != prefill_.get()) return;  // the declined early one: nothing of it counts
    const v1::PrefillResponse& response = prefill_->response;
    producer_.known = true;
    producer_.prefill_us = response.prefill_us();
    producer_.encode_us = response.encode_us();
    producer_.layer_codes_us.assign(response.layer_codes_us().begin(),
                                    response.layer_codes_us().end());
    producer_.cached_tokens = response.cached_tokens();
    if (response.has_link()) producer_.link = response.link();
    std::vector<TargetCall*> failed;
    // Not CANCELLED: the coordinator cancels a Prefill itself (a refused request's early one).
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE && !cancelled() && !ended_) {
      deps_.registry->NoteUnreachable(
          route_.producer_node, absl::StrCat("its Prefill call failed: ", status.error_message()));
    }
    if (!status.ok()) {
      for (auto& [name, call] : prefill_->by_target) {
        call->failure = absl::StrCat("producer ", route_.producer_name, " at ",
                                     route_.producer_address, " failed: ", status.error_message());
        failed.push_back(call);
      }
    } else {
      for (const v1::PrefillOutcome& outcome : response.outcomes()) {
        auto it = prefill_->by_target.find(outcome.target());
        if (outcome.code() == 0 || it == prefill_->by_target.end()) continue;
        it->second->failure =
            absl::StrCat("producer ", route_.producer_name, ": ", outcome.message());
        it->second->consumer_lost = outcome.code() == grpc::StatusCode::UNAVAILABLE;
        failed.push_back(it->second);
      }
    }
    spdlog::info("[{}] prefill on {}: {} ({} us, {} targets failed)", id_, route_.producer_name,
                 status.ok() ? "ok" : ForLog(status.error_message(), 300), response.prefill_us(),
                 failed.size());
    ReleaseParked();
    if (ended_) return;                // refused meanwhile (an early Prefill): nothing to settle
    if (phase_ == Phase::kStarting) {  // an early Prefill: settled once every target started
      failed_early_ = std::move(failed);
      return;
    }
    Settle(std::move(failed));
    phase_ = Phase::kSettled;
  });
}

void RoutedRequest::Settle(std::vector<TargetCall*> failed) {
  // A failed target's consumer ends by itself once its session ended (peer lost within the
  // liveness limit); one whose session never reached it cannot tell a dead producer from a slow
  // one, so it is told (Consumer.TransferFailed). Without a fallback, and no other producer to
  // take the transfer over, the request is over either way: cancel at once -- unless the producer
  // lost that target's consumer (consumer_lost): the node is then likely frozen or gone, its call
  // ends UNAVAILABLE within the keepalive bound (node_ejection.h) and the stream moves to another
  // replica (OnTargetDone), so it keeps the grace period too. With a fallback, give the consumer
  // the grace period to announce that it fell back to its own prefill; after that it runs to its
  // end (its local prefill and decode may take longer than any grace).
  if (failed.empty()) return;
  const bool fall_back = LocalFallbackAllowed(req_) && !cancelled();
  auto cancel_unsettled = [this](const std::vector<TargetCall*>& calls)
                              ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                                for (TargetCall* call : calls) {
                                  if (!call->ended && !call->forward.fell_back() &&
                                      call->takeover_node.empty()) {
                                    call->context.TryCancel();
                                  }
                                }
                              };
  std::vector<TargetCall*> graced;
  for (TargetCall* call : failed) {
    if (call->ended || call->forward.fell_back()) continue;  // settled by itself
    // Another producer of the model may take the transfer over (the consumer asks for it once
    // told): the request may finish without a fallback too.
    const bool takeover = deps_.registry
                              ->ResolveTakeover(call->target().consumer_node,
                                                route_.producer_fingerprint, {route_.producer_node})
                              .ok();
    if (fall_back || takeover) {
      deps_.tell_failed(call->target(), PrefillSessionId(), call->failure);
      graced.push_back(call);
    } else if (call->consumer_lost) {
      graced.push_back(call);
    } else {
      cancel_unsettled({call});
    }
  }
  if (graced.empty()) return;
  grace_ = SetTimer(clock()->Now() + deps_.failed_target_grace,
                    [cancel_unsettled, graced]()
                        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { cancel_unsettled(graced); });
}

Clock::TimerId RoutedRequest::SetTimer(absl::Time when, std::function<void()> fire) {
  Hold();  // released when it fires or is taken back
  return clock()->At(when, [this, fire = std::move(fire)] {
    Locked(fire);
    Release();
  });
}

void RoutedRequest::CancelTimer(Clock::TimerId id) {
  // From within the timer's own callback (its Locked ended the request) Cancel is false and the
  // callback releases; a running one elsewhere is waited for and releases itself.
  if (id != 0 && clock()->Cancel(id)) Release();
}

}  // namespace scd::coordinator
