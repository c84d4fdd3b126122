#include "coordinator/routed_request.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/log_text.h"
#include "base/random_id.h"
#include "codec/transfer_mode.h"
#include "proto/call_watch.h"
#include "proto/frontier_proto.h"
#include "scd/v1/control.grpc.pb.h"

namespace scd::coordinator {
namespace {

std::chrono::system_clock::time_point Deadline(absl::Time t) { return absl::ToChronoTime(t); }

}  // namespace

// One target's Decode call on its consumer, read by its own thread.
struct RoutedRequest::TargetCall {
  TargetCall(const Route* route, size_t index, NodeRegistry* registry)
      : forward(route, index, registry) {}
  TargetForwarder forward;  // under the request's mutex
  grpc::ClientContext context;
  std::thread reader;
  // Under the request's mutex.
  bool ended = false;
  std::string failure;  // why the coordinator gave up on it (for the Error it writes)
  grpc::Status status;  // how the Decode call ended (once `ended`)
  const RouteTarget& target() const { return forward.target(); }
};

RoutedRequest::RoutedRequest(RoutedRequestDeps deps, v1::GenerateRequest req, Route route,
                             const PrefixHint* hint, absl::Time deadline,
                             grpc::ServerContext* context,
                             grpc::ServerWriter<v1::GenerateEvent>* writer)
    : deps_(std::move(deps)),
      req_(std::move(req)),
      route_(std::move(route)),
      id_(ForLog(req_.request_id(), 40)),
      session_id_(RandomId128()),
      routed_at_(absl::Now()),
      deadline_(deadline),
      context_(context),
      writer_(writer),
      metrics_(deps_.metrics) {
  deps_.registry->NoteRouted(route_, hint);
  if (deps_.active != nullptr) ++*deps_.active;
  for (size_t i = 0; i < route_.targets.size(); ++i) {
    calls_.push_back(std::make_unique<TargetCall>(&route_, i, deps_.registry));
    calls_.back()->context.set_deadline(Deadline(deadline_));
  }
  cancel_calls_ = cancellation_.OnCancel([this](const absl::Status&) {
    for (auto& call : calls_) call->context.TryCancel();
  });
}

RoutedRequest::~RoutedRequest() {
  cancel_calls_.Reset();
  JoinReaders();
  deps_.registry->RoutedDone(route_);
  if (deps_.active != nullptr) --*deps_.active;
}

void RoutedRequest::JoinReaders() {
  for (auto& call : calls_) {
    if (call->reader.joinable()) call->reader.join();
  }
}

grpc::Status RoutedRequest::Run() {
  CallCancellationWatch watch(context_, &cancellation_);
  StartTargets();
  WaitAll([](const TargetCall& c) { return c.forward.started() || c.ended; });
  if (std::optional<grpc::Status> refused = Refusal(); refused.has_value()) {
    JoinReaders();
    spdlog::info("[{}] refused by the consumers: {}", id_, ForLog(refused->error_message(), 300));
    return *refused;
  }
  Settle(Prefill());
  WaitAll([](const TargetCall& c) { return c.ended; });
  JoinReaders();
  spdlog::info("[{}] done ({} targets)", id_, calls_.size());
  return grpc::Status::OK;
}

void RoutedRequest::Write(const v1::GenerateEvent& event) {
  metrics_.Observe(event);
  // A write that fails is the client gone: the cancellation ends every target's call.
  if (!cancellation_.cancelled() && !writer_->Write(event)) {
    cancellation_.Cancel(absl::CancelledError("the client went away (a write failed)"));
  }
}

void RoutedRequest::EndWithoutTerminal(TargetCall* call) {
  call->forward.set_terminal();
  const grpc::Status& status = call->status;
  v1::GenerateEvent error;
  error.set_target(call->target().target);
  const bool quiet = status.ok() || status.error_code() == grpc::StatusCode::CANCELLED;
  error.mutable_error()->set_code(quiet && !call->failure.empty()
                                      ? static_cast<int>(grpc::StatusCode::UNAVAILABLE)
                                      : static_cast<int>(status.error_code()));
  error.mutable_error()->set_message(
      !call->failure.empty()
          ? call->failure
          : absl::StrCat("consumer ", call->target().target, " at ",
                         call->target().consumer_address, ": ",
                         status.ok() ? "ended without a result" : status.error_message()));
  Write(error);
}

void RoutedRequest::StartTargets() {
  for (auto& owned : calls_) {
    TargetCall* call = owned.get();
    const RouteTarget& target = call->target();
    v1::DecodeRequest decode;
    *decode.mutable_request() = req_;
    decode.set_target(target.target);
    decode.set_mode(TransferModeName(target.mode));
    decode.set_mode_reason(target.mode_reason);
    decode.set_producer(route_.producer_name);
    decode.set_producer_fingerprint(route_.producer_fingerprint);
    decode.set_artifact_id(target.artifact_id);
    decode.set_session_id(session_id_);
    if (target.point) {
      *decode.mutable_point() = CodePointToProto(*target.point);
      decode.set_expected_kl(target.point->kl);
    }
    deps_.secret->Attach(&call->context);
    call->reader = std::thread([this, call, decode = std::move(decode)]() mutable {
      ReadTarget(call, std::move(decode));
    });
  }
}

void RoutedRequest::ReadTarget(TargetCall* call, v1::DecodeRequest decode) {
  auto stub = v1::Consumer::NewStub(deps_.channel(call->target().consumer_address));
  auto reader = stub->Decode(&call->context, decode);
  v1::GenerateEvent event;
  while (reader->Read(&event)) {
    absl::MutexLock lock(&mu_);
    if (call->forward.NeedsProducer(event)) {
      // The producer's Prefill answer normally precedes the consumer's Finished (it returns at
      // the transfer's ack); a late one is not waited for long.
      mu_.AwaitWithTimeout(absl::Condition(&producer_.known), absl::Seconds(2));
    }
    if (call->forward.Rewrite(producer_, &event)) Write(event);
  }
  const grpc::Status status = reader->Finish();
  absl::MutexLock lock(&mu_);
  call->ended = true;
  call->status = status;
  // Refused before starting: Run decides (the whole call's status, or an Error).
  if (call->forward.terminal() || !call->forward.started()) return;
  EndWithoutTerminal(call);
}

void RoutedRequest::WaitAll(const std::function<bool(const TargetCall&)>& done) {
  absl::MutexLock lock(&mu_);
  auto all = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return std::all_of(calls_.begin(), calls_.end(), [&](const auto& c) { return done(*c); });
  };
  mu_.Await(absl::Condition(&all));
}

std::optional<grpc::Status> RoutedRequest::Refusal() {
  absl::MutexLock lock(&mu_);
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

std::vector<RoutedRequest::TargetCall*> RoutedRequest::Prefill() {
  v1::PrefillRequest prefill;
  *prefill.mutable_request() = req_;
  prefill.set_session_id(session_id_);
  std::map<std::string, TargetCall*> by_target;
  {
    absl::MutexLock lock(&mu_);
    for (auto& call : calls_) {
      const TargetForwarder& f = call->forward;
      if (!f.started() || call->ended || f.fell_back() ||
          f.started_mode() == TransferMode::kLocal) {
        continue;
      }
      const RouteTarget& route = call->target();
      v1::PrefillTarget* target = prefill.add_targets();
      target->set_target(route.target);
      target->set_transfer_address(route.transfer_address);
      target->set_consumer_fingerprint(route.consumer_fingerprint);
      target->set_mode(TransferModeName(f.started_mode()));
      target->set_artifact_id(route.artifact_id);
      target->set_consumer_cached_tokens(f.consumer_cached_tokens());
      if (route.point) *target->mutable_point() = CodePointToProto(*route.point);
      if (route.deliver_by_us > 0 && !req_.keep_ranks()) {
        // The codes' delivery deadline, from now: what the choice's prediction left of it.
        const double left_us =
            route.deliver_by_us - absl::ToDoubleMicroseconds(absl::Now() - routed_at_);
        target->set_adapt_within_us(static_cast<uint64_t>(std::max(1.0, left_us)));
        target->set_planned_goodput_bytes_per_s(route.planned_goodput_bytes_per_s);
      }
      by_target[route.target] = call.get();
    }
    if (by_target.empty()) {
      producer_.known = true;
      return {};
    }
  }
  // A child of the client's call: a client that goes away cancels the prefill (and so every
  // session it streams) while it runs, not after.
  std::unique_ptr<grpc::ClientContext> prefill_context =
      grpc::ClientContext::FromServerContext(*context_);
  prefill_context->set_deadline(Deadline(deadline_));
  deps_.secret->Attach(prefill_context.get());
  v1::PrefillResponse response;
  const grpc::Status status = v1::Producer::NewStub(deps_.channel(route_.producer_address))
                                  ->Prefill(prefill_context.get(), prefill, &response);
  std::vector<TargetCall*> failed;
  absl::MutexLock lock(&mu_);
  producer_.known = true;
  producer_.prefill_us = response.prefill_us();
  producer_.encode_us = response.encode_us();
  producer_.cached_tokens = response.cached_tokens();
  if (response.has_link()) producer_.link = response.link();
  if (!status.ok()) {
    for (auto& [name, call] : by_target) {
      call->failure = absl::StrCat("producer ", route_.producer_name, " at ",
                                   route_.producer_address, " failed: ", status.error_message());
      failed.push_back(call);
    }
  } else {
    for (const v1::PrefillOutcome& outcome : response.outcomes()) {
      auto it = by_target.find(outcome.target());
      if (outcome.code() == 0 || it == by_target.end()) continue;
      it->second->failure =
          absl::StrCat("producer ", route_.producer_name, ": ", outcome.message());
      failed.push_back(it->second);
    }
  }
  spdlog::info("[{}] prefill on {}: {} ({} us, {} targets failed)", id_, route_.producer_name,
               status.ok() ? "ok" : ForLog(status.error_message(), 300), response.prefill_us(),
               failed.size());
  return failed;
}

void RoutedRequest::Settle(const std::vector<TargetCall*>& failed) {
  // A failed target's consumer ends by itself once its session ended (peer lost within the
  // liveness limit); one whose session never reached it cannot tell a dead producer from a slow
  // one, so it is told (Consumer.TransferFailed). Without a fallback the request is over either
  // way: cancel at once. With one, give the consumer the grace period to announce that it fell
  // back to its own prefill; after that it runs to its end (its local prefill and decode may
  // take longer than any grace).
  const bool fall_back = req_.allow_local_fallback() && !cancellation_.cancelled();
  if (fall_back) {
    for (TargetCall* call : failed) {
      std::string reason;
      {
        absl::MutexLock lock(&mu_);
        if (call->ended || call->forward.fell_back()) continue;  // settled by itself
        reason = call->failure;
      }
      deps_.tell_failed(call->target(), session_id_, reason);
    }
  }
  const absl::Time grace_end =
      absl::Now() + (fall_back ? deps_.failed_target_grace : absl::ZeroDuration());
  for (TargetCall* call : failed) {
    absl::MutexLock lock(&mu_);
    auto settled = [call]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return call->ended || call->forward.fell_back();
    };
    mu_.AwaitWithDeadline(absl::Condition(&settled), grace_end);
    if (!settled()) call->context.TryCancel();
  }
}

}  // namespace scd::coordinator
