#include "consumer/inference_service.h"

#include <spdlog/spdlog.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/log_text.h"
#include "base/random_id.h"
#include "codec/transfer_mode.h"
#include "consumer/served_request.h"
#include "proto/grpc_util.h"
#include "proto/wire_mode.h"
#include "serving/checked_inference.h"

namespace scd::consumer {

ConsumerInferenceService::ConsumerInferenceService(ConsumerModel consumer, std::string fingerprint,
                                                   std::shared_ptr<Admission> admission,
                                                   Tally* refusals)
    : consumer_(std::move(consumer)),
      fingerprint_(std::move(fingerprint)),
      admission_(std::move(admission)),
      refusals_(refusals) {}

EventStream* ConsumerInferenceService::Generate(grpc::CallbackServerContext* context,
                                                v1::GenerateRequest req, EventStream::Ended ended) {
  const absl::Time received = absl::Now();
  if (req.request_id().empty()) req.set_request_id(RandomId128());
  const std::string id = ForLog(req.request_id(), 40);  // for logs
  auto refuse = [&](const absl::Status& status) {
    CountRefusal(refusals_, status);
    spdlog::info("[{}] refused: {}", id, ForLog(status.ToString(), 300));
    return RefusedStream(ToGrpcStatus(status), ended);
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
  absl::StatusOr<RequestedMode> mode = RequestModeOf(req);
  if (!mode.ok()) return refuse(mode.status());
  if (mode->is_auto()) {
    route.mode_reason = "a consumer called directly has no producer: local prefill";
  } else if (!mode->Is(TransferMode::kLocal)) {
    return refuse(absl::FailedPreconditionError(
        absl::StrCat("mode ", RequestedModeName(*mode),
                     " needs a producer: send the request through the coordinator")));
  }
  absl::StatusOr<std::vector<TokenId>> prompt_ids = CheckRequest(consumer_, req);
  if (!prompt_ids.ok()) return refuse(prompt_ids.status());
  ServedRequest served;
  served.handler = "ConsumerInferenceService::Generate";
  served.id = id;
  served.request = std::move(req);
  served.route = std::move(route);
  served.prompt_ids = *std::move(prompt_ids);
  served.received = received;
  served.call_deadline = FromGrpcDeadline(context->deadline());
  return ServeOnStream(consumer_, *admission_, refusals_, std::move(ended), std::move(served));
}

grpc::Status ConsumerInferenceService::ListModels(v1::ListModelsResponse* response) {
  v1::ModelInfo* info = response->add_models();
  info->set_name(consumer_.name);
  info->set_role("consumer");
  info->set_fingerprint(fingerprint_);
  return grpc::Status::OK;
}

grpc::Status ConsumerInferenceService::Health(v1::HealthResponse* response) {
  response->set_status(admission_->draining() ? "draining" : "serving");
  response->set_role("consumer");
  response->set_active_requests(admission_->active());
  return grpc::Status::OK;
}

}  // namespace scd::consumer
