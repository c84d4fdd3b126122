#include "proto/inference_client.h"

#include <grpcpp/grpcpp.h>

#include <cstdlib>

#include "base/grpc_tls.h"
#include "proto/grpc_util.h"
#include "scd/v1/inference.grpc.pb.h"

namespace scd {
namespace {

std::unique_ptr<v1::Inference::Stub> Stub(const std::string& server) {
  return v1::Inference::NewStub(grpc::CreateChannel(server, GrpcChannelCredentials()));
}

// $SCD_API_TOKEN, when set, as the bearer token (as OpenAI's clients read OPENAI_API_KEY).
void AttachApiToken(grpc::ClientContext* context) {
  const char* token = std::getenv("SCD_API_TOKEN");
  if (token != nullptr && *token != '\0') {
    context->AddMetadata("authorization", std::string("Bearer ") + token);
  }
}

}  // namespace

absl::Status StreamGenerate(const std::string& server, const v1::GenerateRequest& request,
                            absl::Duration timeout,
                            const std::function<void(const v1::GenerateEvent&)>& on_event) {
  auto stub = Stub(server);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  AttachApiToken(&context);
  auto reader = stub->Generate(&context, request);
  v1::GenerateEvent event;
  while (reader->Read(&event)) on_event(event);
  return FromGrpcStatus(reader->Finish());
}

bool IsResumableBreak(const absl::Status& status) {
  return absl::IsUnavailable(status) || absl::IsCancelled(status) || absl::IsAborted(status) ||
         absl::IsUnknown(status);
}

v1::GenerateRequest ResumeRequest(const v1::GenerateRequest& request, const std::string& token,
                                  const std::vector<int32_t>& received) {
  v1::GenerateRequest next = request;
  next.set_resume_token(token);
  next.clear_resume_received_ids();
  for (int32_t id : received) next.add_resume_received_ids(id);
  return next;
}

absl::Status StreamGenerateResuming(const std::vector<std::string>& servers,
                                    const v1::GenerateRequest& request, absl::Duration timeout,
                                    const std::function<void(const v1::GenerateEvent&)>& on_event,
                                    int* resumes, const GenerateCall& call) {
  if (servers.empty()) return absl::InvalidArgumentError("no server to send the request to");
  const absl::Time deadline = absl::Now() + timeout;
  std::string token;              // the Started's resume token
  std::vector<int32_t> received;  // output ids so far
  bool ended = false;             // the target's Finished or Error came
  v1::GenerateRequest next = request;
  absl::Status status;
  size_t server = 0;
  for (size_t tries = 0;; ++tries) {
    status = (call ? call : GenerateCall(StreamGenerate))(
        servers[server], next, deadline - absl::Now(), [&](const v1::GenerateEvent& event) {
          if (event.has_started()) token = event.started().resume_token();
          if (event.has_token()) {
            received.insert(received.end(), event.token().ids().begin(), event.token().ids().end());
          }
          if (event.has_finished() || event.has_error()) ended = true;
          on_event(event);
        });
    if (!IsResumableBreak(status) || ended || token.empty() || tries + 1 >= servers.size() + 1 ||
        absl::Now() >= deadline) {
      return status;
    }
    // The next coordinator, with the token and what came.
    server = (server + 1) % servers.size();
    next = ResumeRequest(request, token, received);
    if (resumes != nullptr) ++*resumes;
  }
}

absl::StatusOr<std::vector<v1::ModelInfo>> ListModels(const std::string& server,
                                                      absl::Duration timeout) {
  auto stub = Stub(server);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  AttachApiToken(&context);
  v1::ListModelsResponse response;
  const grpc::Status status = stub->ListModels(&context, v1::ListModelsRequest(), &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return std::vector<v1::ModelInfo>(response.models().begin(), response.models().end());
}

}  // namespace scd
