#include "consumer/inference_service.h"

#include <spdlog/spdlog.h>

#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/exception_guard.h"
#include "base/log_text.h"
#include "base/random_id.h"
#include "proto/call_watch.h"
#include "proto/checked_inference.h"
#include "proto/grpc_util.h"

namespace scd::consumer {

ConsumerInferenceService::ConsumerInferenceService(ConsumerModel consumer, std::string fingerprint,
                                                   std::shared_ptr<Admission> admission,
                                                   Tally* refusals)
    : consumer_(std::move(consumer)),
      fingerprint_(std::move(fingerprint)),
      admission_(std::move(admission)),
      refusals_(refusals) {}

grpc::Status ConsumerInferenceService::Generate(grpc::ServerContext* context,
                                                const v1::GenerateRequest* request,
                                                grpc::ServerWriter<v1::GenerateEvent>* writer) {
  const absl::Time received = absl::Now();
  v1::GenerateRequest req = *request;
  if (req.request_id().empty()) req.set_request_id(RandomId128());
  const std::string id = ForLog(req.request_id(), 40);  // for logs
  auto refuse = [&](const absl::Status& status) {
    CountRefusal(refusals_, status);
    spdlog::info("[{}] refused: {}", id, ForLog(status.ToString(), 300));
    return ToGrpcStatus(status);
  };
  // Refusals of the request as a whole: a non-OK RPC status, no event.
  for (const std::string& target : req.targets()) {
    if (target != consumer_.name) {
      return refuse(absl::NotFoundError(
          absl::StrCat("unknown target '", ForLog(target), "'; this consumer serves '",
                       consumer_.name, "' (send fan-out requests to the coordinator)")));
    }
  }
  TargetRoute route;
  const std::string mode = req.mode().empty() ? "auto" : req.mode();
  if (mode == "auto") {
    route.mode_reason = "a consumer called directly has no producer: local prefill";
  } else if (mode != "local") {
    return refuse(absl::FailedPreconditionError(
        absl::StrCat("mode ", ForLog(mode),
                     " needs a producer: send the request through the coordinator")));
  }
  absl::StatusOr<std::vector<TokenId>> prompt_ids = CheckRequest(consumer_, req);
  if (!prompt_ids.ok()) return refuse(prompt_ids.status());
  // Admitted by KV memory (waiting in the queue while it does not fit); a client that cancels
  // while waiting leaves the queue.
  std::atomic<bool> cancelled{false};
  CallCancellationWatch watch(context, &cancelled);
  const absl::Time deadline =
      received + (req.deadline_ms() > 0 ? absl::Milliseconds(req.deadline_ms())
                                        : consumer_.default_deadline);
  absl::StatusOr<std::unique_ptr<Admission::Reservation>> reservation = admission_->Admit(
      ReservationBytes(consumer_, req, prompt_ids->size()), deadline, &cancelled);
  if (!reservation.ok()) return refuse(reservation.status());
  spdlog::info("[{}] admitted ({} of {} running, {} KV bytes reserved, waited {})", id,
               admission_->active(), admission_->capacity(), (*reservation)->bytes(),
               absl::FormatDuration((*reservation)->waited()));

  RunContext run;
  run.received = received;
  run.cancelled = &cancelled;
  run.prompt_ids = *std::move(prompt_ids);
  ServingMetrics::Call metrics(consumer_.metrics);
  absl::Status status = GuardExceptions("ConsumerInferenceService::Generate", [&] {
    return RunTarget(consumer_, req, route, run, [&](const v1::GenerateEvent& event) {
      metrics.Observe(event);
      if (!cancelled && !writer->Write(event)) cancelled = true;  // the client went away
    });
  });
  spdlog::info("[{}] ended: {}{}", id, ForLog(status.ToString(), 300),
               cancelled ? " (client cancelled)" : "");
  if (cancelled) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client");
  return grpc::Status::OK;  // the terminal event carries the outcome
}

grpc::Status ConsumerInferenceService::ListModels(grpc::ServerContext*,
                                                  const v1::ListModelsRequest*,
                                                  v1::ListModelsResponse* response) {
  v1::ModelInfo* info = response->add_models();
  info->set_name(consumer_.name);
  info->set_role("consumer");
  info->set_fingerprint(fingerprint_);
  return grpc::Status::OK;
}

grpc::Status ConsumerInferenceService::Health(grpc::ServerContext*, const v1::HealthRequest*,
                                              v1::HealthResponse* response) {
  response->set_status(admission_->draining() ? "draining" : "serving");
  response->set_role("consumer");
  response->set_active_requests(admission_->active());
  return grpc::Status::OK;
}

}  // namespace scd::consumer
