#include "consumer/decode_service.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "base/exception_guard.h"
#include "codec/transfer_mode.h"
#include "proto/call_watch.h"
#include "proto/grpc_util.h"

namespace scd::consumer {

ConsumerControlService::ConsumerControlService(ConsumerModel consumer,
                                               std::map<std::string, const Artifact*> artifacts,
                                               std::shared_ptr<Admission> admission,
                                               SessionRouter* router)
    : consumer_(std::move(consumer)),
      artifacts_(std::move(artifacts)),
      admission_(std::move(admission)),
      router_(router) {}

grpc::Status ConsumerControlService::Decode(grpc::ServerContext* context,
                                            const v1::DecodeRequest* request,
                                            grpc::ServerWriter<v1::GenerateEvent>* writer) {
  const absl::Time received = absl::Now();
  const std::string& id = request->request().request_id();
  if (request->target() != consumer_.name) {
    return grpc::Status(
        grpc::StatusCode::NOT_FOUND,
        absl::StrCat("this consumer serves '", consumer_.name, "', not '", request->target(), "'"));
  }
  TargetRoute route;
  route.mode = request->mode().empty() ? "local" : request->mode();
  route.mode_reason = request->mode_reason();
  route.producer = request->producer();
  absl::StatusOr<TransferMode> mode = ParseTransferMode(route.mode);
  if (!mode.ok()) return ToGrpcStatus(mode.status());
  if (ModeNeedsArtifact(*mode)) {
    auto it = artifacts_.find(request->artifact_id());
    if (it == artifacts_.end()) {
      return grpc::Status(
          grpc::StatusCode::FAILED_PRECONDITION,
          absl::StrCat("mode ", route.mode, " needs artifact '", request->artifact_id(),
                       "', which this consumer does not hold"));
    }
    route.artifact = it->second;
  }
  absl::StatusOr<std::unique_ptr<Admission::Slot>> slot = admission_->Admit();
  if (!slot.ok()) {
    spdlog::info("[{}] refused: {}", id, slot.status().ToString());
    return ToGrpcStatus(slot.status());
  }
  std::unique_ptr<SessionRouter::Ticket> ticket;
  if (route.mode != "local") {
    absl::StatusOr<std::unique_ptr<SessionRouter::Ticket>> expected =
        router_->Expect(SessionTag(id, consumer_.name));
    if (!expected.ok()) return ToGrpcStatus(expected.status());
    ticket = *std::move(expected);
  }
  spdlog::info("[{}] admitted for {} from {} ({} of {} running)", id, route.mode, route.producer,
               admission_->active(), admission_->capacity());

  std::atomic<bool> cancelled{false};
  CallCancellationWatch watch(context, &cancelled);
  RunContext run;
  run.received = received;
  run.cancelled = &cancelled;
  run.session = [&](absl::Duration timeout) { return ticket->Wait(timeout); };
  auto write = [&](const v1::GenerateEvent& event) {
    if (context->IsCancelled()) cancelled = true;
    if (!cancelled && !writer->Write(event)) cancelled = true;
  };
  // A second Started (mode local) on this control stream tells the coordinator the consumer fell
  // back to its own prefill; the coordinator does not forward it (control.proto).
  run.on_fallback = [&](const v1::GenerateEvent& started) {
    spdlog::info("[{}] falling back: {}", id, started.started().mode_reason());
    write(started);
  };
  absl::Status status = GuardExceptions("ConsumerControlService::Decode", [&] {
    return RunTarget(consumer_, request->request(), route, run, write);
  });
  spdlog::info("[{}] ended: {}{}", id, status.ToString(), cancelled ? " (cancelled)" : "");
  ended_.Add(cancelled ? "request_cancelled"
             : status.ok()
                 ? "request_finished"
                 : absl::StrCat("request_",
                                absl::AsciiStrToLower(absl::StatusCodeToString(status.code()))));
  if (cancelled) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the caller");
  return grpc::Status::OK;
}

grpc::Status ConsumerControlService::Stats(grpc::ServerContext*, const v1::StatsRequest*,
                                           v1::NodeStats* stats) {
  stats->set_role("consumer");
  stats->set_running(admission_->active());
  stats->set_capacity(admission_->capacity());
  stats->set_open_sessions(static_cast<uint32_t>(router_->open_sessions()));
  for (const auto& [name, count] : ended_.Snapshot()) (*stats->mutable_ended())[name] = count;
  return grpc::Status::OK;
}

}  // namespace scd::consumer
