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
