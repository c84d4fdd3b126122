#include "consumer/decode_service.h"

#include <spdlog/spdlog.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "base/log_text.h"
#include "base/release_clock.h"
#include "base/status_macros.h"
#include "codec/transfer_mode.h"
#include "consumer/continuation_check.h"
#include "consumer/served_request.h"
#include "proto/grpc_util.h"
#include "proto/prefix_cache_stats.h"
#include "proto/requested_point.h"
#include "proto/session_tag.h"
#include "proto/wire_mode.h"
#include "serving/checked_inference.h"
#include "serving/stats_wait.h"

namespace scd::consumer {

namespace {

// The wait for one transfer session, which holds no thread: the ticket says when the session
// arrived (or failed), a timer when it is late.
struct SessionWait {
  std::unique_ptr<SessionRouter::Ticket> ticket;
  Clock::Timer late;                     // cancelled when the request lets go of the wait
  Cancellation::Registration on_cancel;  // a takeover's: the request's cancellation fails it
};

// RunContext's session source and wait over `wait`. Its callbacks reach the ticket, not the
// router: a request may outlive the router (a node stopping), and the ticket outlives its timer
// and cancellation registration (SessionWait's order; both wait for a running callback).
void SessionSourceOf(const std::shared_ptr<SessionWait>& wait, SessionSource* session,
                     std::function<void(absl::Duration, std::function<void()>)>* on_session) {
  *session = [wait](absl::Duration timeout) { return wait->ticket->Wait(timeout); };
  *on_session = [wait](absl::Duration timeout, std::function<void()> ready) {
    Clock* clock = Clock::Real();
    SessionRouter::Ticket* ticket = wait->ticket.get();
    wait->late = Clock::Timer(clock, clock->Now() + timeout, [ticket, timeout] {
      ticket->FailWaiting(absl::DeadlineExceededError(
          absl::StrCat("no transfer session within ", absl::FormatDuration(timeout))));
    });
    wait->ticket->OnArrival(std::move(ready));
  };
}

// A takeover of `session_id`'s transfer (ServedRequest::take_over), expected on the router of
// `expected` (the request's own wait) under TakeoverSessionId, woken by the request's
// cancellation.
absl::StatusOr<RunContext::Takeover> ExpectTakeover(SessionRouter::Ticket& expected,
                                                    const std::string& consumer,
                                                    const std::string& session_id,
                                                    v1::GenerateEvent* notice,
                                                    Cancellation* cancellation) {
  v1::TransferLost& lost = *notice->mutable_transfer_lost();
  lost.set_session_id(session_id);
  const std::string tag = SessionTag(TakeoverSessionId(session_id, lost.takeover()), consumer);
  auto wait = std::make_shared<SessionWait>();
  SCD_ASSIGN_OR_RETURN(wait->ticket, expected.Expect(tag));
  if (cancellation != nullptr) {
    SessionRouter::Ticket* ticket = wait->ticket.get();
    wait->on_cancel =
        cancellation->OnCancel([ticket](const absl::Status& why) { ticket->Fail(why); });
  }
  RunContext::Takeover takeover;
  SessionSourceOf(wait, &takeover.session, &takeover.on_session);
  return takeover;
}

// The request's wait for its transfer session (`ticket`, under `session_id`) and its takeovers'.
void WaitForSession(std::unique_ptr<SessionRouter::Ticket> ticket, const std::string& consumer,
                    const std::string& session_id, ServedRequest* served) {
  auto wait = std::make_shared<SessionWait>();
  wait->ticket = std::move(ticket);
  SessionSourceOf(wait, &served->session, &served->on_session);
  served->on_cancel = [wait](const absl::Status& why) { wait->ticket->Fail(why); };
  served->take_over = [wait, consumer, session_id](v1::GenerateEvent* notice,
                                                   Cancellation* cancellation) {
    return ExpectTakeover(*wait->ticket, consumer, session_id, notice, cancellation);
  };
}

// ServedRequest::decline_early: the early session (arrived or to come) is refused -- the
// producer's pass for it stops -- and the codes are expected under EarlyDeclinedSessionId.
absl::Status DeclineEarlySession(SessionRouter* router, const std::string& consumer,
                                 const std::string& session_id, ServedRequest* served) {
  router->Fail(SessionTag(session_id, consumer),
               absl::AbortedError("the consumer queued the request: early prefill declined"));
  served->session = nullptr;  // the ticket goes with them: its tag is ended
  served->on_session = nullptr;
  served->on_cancel = nullptr;
  served->take_over = nullptr;
  const std::string declined = EarlyDeclinedSessionId(session_id);
  absl::StatusOr<std::unique_ptr<SessionRouter::Ticket>> ticket =
      router->Expect(SessionTag(declined, consumer));
  if (!ticket.ok()) return ticket.status();
  WaitForSession(*std::move(ticket), consumer, declined, served);
  served->route.early_prefill = false;
  served->route.early_declined = true;
  return absl::OkStatus();
}

}  // namespace

ConsumerControlService::ConsumerControlService(ConsumerModel consumer,
                                               std::map<std::string, const Artifact*> artifacts,
                                               std::shared_ptr<Admission> admission,
                                               SessionRouter* router, ClusterSecret secret)
    : consumer_(std::move(consumer)),
      artifacts_(std::move(artifacts)),
      admission_(std::move(admission)),
      router_(router),
      secret_(std::move(secret)) {}

grpc::Status ConsumerControlService::Refuse(const std::string& id, const absl::Status& status) {
  CountRefusal(&ended_, status);
  spdlog::info("[{}] refused: {}", id, ForLog(status.ToString(), 300));
  return ToGrpcStatus(status);
}

grpc::ServerWriteReactor<v1::GenerateEvent>* ConsumerControlService::Decode(
    grpc::CallbackServerContext* context, const v1::DecodeRequest* request) {
  const absl::Time received = absl::Now();
  if (grpc::Status auth = secret_.Check(*context); !auth.ok()) {
    CountRefusal(&ended_, FromGrpcStatus(auth));
    return RefusedStream(auth);
  }
  absl::StatusOr<ServedRequest> served = Route(request, received);
  if (!served.ok()) {
    return RefusedStream(Refuse(ForLog(request->request().request_id(), 40), served.status()));
  }
  served->call_deadline = FromGrpcDeadline(context->deadline());
  return ServeOnStream(consumer_, *admission_, &ended_, nullptr, *std::move(served));
}

absl::StatusOr<ServedRequest> ConsumerControlService::Route(const v1::DecodeRequest* request,
                                                            absl::Time received) {
  if (request->target() != consumer_.name) {
    return absl::NotFoundError(absl::StrCat("this consumer serves '", consumer_.name, "', not '",
                                            ForLog(request->target()), "'"));
  }
  TargetRoute route;
  absl::StatusOr<TransferMode> mode = TargetModeOf(*request);
  if (!mode.ok()) return mode.status();
  route.mode = *mode;
  route.mode_reason = request->mode_reason();
  route.producer = request->producer();
  route.producer_fingerprint = request->producer_fingerprint();
  route.artifact_id = request->artifact_id();
  if (ModeServedWithArtifact(*mode)) {
    auto it = artifacts_.find(request->artifact_id());
    if (it == artifacts_.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("mode ", TransferModeName(*mode), " needs artifact '",
                       ForLog(request->artifact_id()), "', which this consumer does not hold"));
    }
    route.artifact = it->second;
  }
  if (request->has_point()) {
    absl::StatusOr<FrontierPoint> point =
        RequestedPoint(request->point(), *mode, route.artifact, request->artifact_id());
    if (!point.ok()) return point.status();
    route.point = *std::move(point);
    route.expected_kl = request->expected_kl();
  }
  if (request->early_prefill() && route.mode == TransferMode::kLocal) {
    return absl::InvalidArgumentError("early_prefill: set for a local target");
  }
  route.early_prefill = request->early_prefill();
  if (route.mode != TransferMode::kLocal && request->session_id().empty()) {
    return absl::InvalidArgumentError("session_id: empty (the coordinator sets it)");
  }
  // Expected before the request's own checks: a refusal then ends the tag, and the session of
  // an early prefill that comes later is refused at once (the producer's pass stops).
  std::unique_ptr<SessionRouter::Ticket> ticket;
  if (route.mode != TransferMode::kLocal) {
    absl::StatusOr<std::unique_ptr<SessionRouter::Ticket>> expected =
        router_->Expect(SessionTag(request->session_id(), consumer_.name));
    if (!expected.ok()) return expected.status();
    ticket = *std::move(expected);
  }
  absl::StatusOr<std::vector<TokenId>> prompt_ids = CheckRequest(consumer_, request->request());
  if (!prompt_ids.ok()) return prompt_ids.status();
  SCD_RETURN_IF_ERROR(
      ContinueStream(consumer_, request->request(),
                     absl::MakeConstSpan(request->continued_ids().data(),
                                         static_cast<size_t>(request->continued_ids_size())),
                     &route, &*prompt_ids));
  route.continued_exact = request->continued_mode() == v1::TRANSFER_MODE_LOCAL;
  ServedRequest served;
  served.handler = "ConsumerControlService::Decode";
  served.id = ForLog(request->request().request_id(), 40);
  served.request = request->request();
  served.route = std::move(route);
  served.prompt_ids = *std::move(prompt_ids);
  served.received = received;
  if (ticket != nullptr) {
    WaitForSession(std::move(ticket), consumer_.name, request->session_id(), &served);
  }
  if (served.route.early_prefill) {
    served.decline_early = [router = router_, name = consumer_.name,
                            session_id = request->session_id()](ServedRequest* s) {
      return DeclineEarlySession(router, name, session_id, s);
    };
  }
  served.announce_fallback = true;
  return served;
}

grpc::Status ConsumerControlService::TransferFailed(grpc::ServerContext* context,
                                                    const v1::TransferFailedRequest* request,
                                                    v1::TransferFailedResponse* response) {
  if (grpc::Status auth = secret_.Check(*context); !auth.ok()) return auth;
  if (request->target() != consumer_.name) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("this consumer serves '", consumer_.name, "', not '",
                                     ForLog(request->target(), 128), "'"));
  }
  const std::string reason = ForLog(request->reason(), 1000);
  const SessionRouter::FailOutcome found = router_->Fail(
      SessionTag(request->session_id(), consumer_.name),
      absl::UnavailableError(absl::StrCat("the coordinator reports the transfer failed: ",
                                          reason.empty() ? "no reason given" : reason)));
  switch (found) {
    case SessionRouter::FailOutcome::kWaiting:
      response->set_found(v1::TransferFailedResponse::FOUND_WAITING);
      break;
    case SessionRouter::FailOutcome::kReceiving:
      response->set_found(v1::TransferFailedResponse::FOUND_RECEIVING);
      break;
    case SessionRouter::FailOutcome::kNone:
      response->set_found(v1::TransferFailedResponse::FOUND_NONE);
      break;
  }
  spdlog::info("[session {}] the coordinator reports its transfer failed ({}): {}",
               ForLog(request->session_id(), 40),
               v1::TransferFailedResponse::Found_Name(response->found()), reason);
  return grpc::Status::OK;
}

grpc::Status ConsumerControlService::Stats(grpc::ServerContext* context,
                                           const v1::StatsRequest* request, v1::NodeStats* stats) {
  if (grpc::Status auth = secret_.Check(*context); !auth.ok()) return auth;
  const uint64_t change = AwaitStatsChange(*request, *context);
  FillStats(stats);
  stats->set_change_count(change);
  return grpc::Status::OK;
}

void ConsumerControlService::FillStats(v1::NodeStats* stats) const {
  stats->set_role("consumer");
  stats->set_last_release_unix_micros(LastReleaseUnixMicros());
  stats->set_running(admission_->active());
  stats->set_capacity(admission_->capacity());
  stats->set_open_sessions(static_cast<uint32_t>(router_->open_sessions()));
  stats->set_queued(admission_->queued());
  stats->set_most_queued(admission_->most_queued());
  stats->set_kv_reserved_bytes(static_cast<uint64_t>(admission_->reserved_bytes()));
  stats->set_kv_budget_bytes(static_cast<uint64_t>(admission_->budget_bytes()));
  if (consumer_.scheduler != nullptr) {
    const DecodeScheduler::Stats scheduler = consumer_.scheduler->stats();
    stats->set_sequences(static_cast<uint32_t>(scheduler.running));
    stats->set_steps(static_cast<uint64_t>(scheduler.steps));
    stats->set_max_batch(static_cast<uint32_t>(scheduler.max_batch));
    stats->set_local_itl_us_per_token(scheduler.local_itl_us_per_token);
    stats->set_rebuild_itl_us_per_token(scheduler.rebuild_itl_us_per_token);
    stats->set_busy_prefill_us_per_token(scheduler.busy_prefill_us_per_token);
  }
  for (const auto& [name, count] : ended_.Snapshot()) (*stats->mutable_ended())[name] = count;
  if (consumer_.prefix_cache != nullptr) {
    SetPrefixCacheStats(consumer_.prefix_cache->blocks().Counters(), stats);
  }
}

}  // namespace scd::consumer
