#include "serving/checked_inference.h"

#include <arpa/inet.h>
#include <google/protobuf/unknown_field_set.h>
#include <grpcpp/impl/rpc_service_method.h>
#include <grpcpp/support/method_handler.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <cstring>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/log_text.h"
#include "base/status_macros.h"
#include "proto/grpc_util.h"
#include "proto/request_validation.h"
#include "proto/wire_mode.h"

#ifndef SCD_VERSION
#define SCD_VERSION "unknown"
#endif

namespace scd {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::UnknownField;
using google::protobuf::UnknownFieldSet;

std::optional<std::string> FindIn(const Descriptor& type, std::string_view bytes, int depth,
                                  bool* malformed) {
  UnknownFieldSet fields;
  if (depth > 16 || !fields.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    *malformed = true;
    return std::nullopt;
  }
  std::map<int, int> index;  // repeated fields: the element's position
  for (int i = 0; i < fields.field_count(); ++i) {
    const UnknownField& field = fields.field(i);
    const FieldDescriptor* descriptor = type.FindFieldByNumber(field.number());
    if (descriptor == nullptr || field.type() != UnknownField::TYPE_LENGTH_DELIMITED) continue;
    std::string name = descriptor->name();
    if (descriptor->is_repeated()) name = absl::StrCat(name, "[", index[field.number()]++, "]");
    const std::string& value = field.length_delimited();
    if (descriptor->type() == FieldDescriptor::TYPE_STRING && !IsValidUtf8(value)) return name;
    if (descriptor->type() == FieldDescriptor::TYPE_MESSAGE) {
      if (auto inner = FindIn(*descriptor->message_type(), value, depth + 1, malformed)) {
        return absl::StrCat(name, ".", *inner);
      }
      if (*malformed) return std::nullopt;
    }
  }
  return std::nullopt;
}

}  // namespace

const char* BuildVersion() { return SCD_VERSION; }

void CountRefusal(Tally* refusals, const absl::Status& status) {
  if (refusals == nullptr || status.ok()) return;
  refusals->Add(
      absl::StrCat("refused_", absl::AsciiStrToLower(absl::StatusCodeToString(status.code()))));
}

std::optional<std::string> FindInvalidUtf8(const Descriptor& type, std::string_view bytes,
                                           bool* malformed) {
  bool ignored = false;
  if (malformed == nullptr) malformed = &ignored;
  *malformed = false;
  return FindIn(type, bytes, 0, malformed);
}

EventStream* RefusedStream(grpc::Status status, EventStream::Ended ended) {
  auto* stream = new EventStream(1, std::move(ended));
  stream->End(std::move(status));
  return stream;
}

CheckedInferenceService::CheckedInferenceService(InferenceBackend* backend, RequestLimits limits,
                                                 bool require_target, Tally* refusals,
                                                 ServingMetrics* metrics, PublicApiGuards guards)
    : backend_(backend),
      limits_(limits),
      require_target_(require_target),
      refusals_(refusals),
      metrics_(metrics),
      guards_(std::move(guards)) {
  using grpc::internal::RpcMethod;
  using grpc::internal::RpcServiceMethod;
  using Self = CheckedInferenceService;
  AddMethod(
      new RpcServiceMethod("/scd.v1.Inference/Generate", RpcMethod::SERVER_STREAMING, nullptr));
  MarkMethodCallback(
      0, new grpc::internal::CallbackServerStreamingHandler<grpc::ByteBuffer, v1::GenerateEvent>(
             [this](grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw) {
               return Generate(context, raw);
             }));
  AddMethod(new RpcServiceMethod(
      "/scd.v1.Inference/ListModels", RpcMethod::NORMAL_RPC,
      new grpc::internal::RpcMethodHandler<Self, v1::ListModelsRequest, v1::ListModelsResponse,
                                           grpc::protobuf::MessageLite,
                                           grpc::protobuf::MessageLite>(
          [](Self* self, grpc::ServerContext* context, const v1::ListModelsRequest*,
             v1::ListModelsResponse* response) {
            if (absl::Status auth = self->Authenticate(*context); !auth.ok()) {
              return self->Refuse(*context, auth, "");
            }
            return self->backend_->ListModels(response);
          },
          this)));
  AddMethod(new RpcServiceMethod(
      "/scd.v1.Inference/Health", RpcMethod::NORMAL_RPC,
      new grpc::internal::RpcMethodHandler<Self, v1::HealthRequest, v1::HealthResponse,
                                           grpc::protobuf::MessageLite,
                                           grpc::protobuf::MessageLite>(
          [](Self* self, grpc::ServerContext*, const v1::HealthRequest*,
             v1::HealthResponse* response) {
            grpc::Status status = self->backend_->Health(response);
            if (response->version().empty()) response->set_version(BuildVersion());
            return status;
          },
          this)));
}

grpc::Status CheckedInferenceService::Refuse(const grpc::ServerContextBase& context,
                                             const absl::Status& status,
                                             const std::string& request_id) {
  CountRefusal(refusals_, status);
  if (metrics_ != nullptr) metrics_->CountRefused(status);
  spdlog::info("[{}] refused from {}: {}", ForLog(request_id, 40), ForLog(context.peer()),
               ForLog(status.ToString(), 300));
  return ToGrpcStatus(status);
}

std::string ClientOf(const grpc::ServerContextBase& context) {
  const std::string peer = context.peer();
  for (const char* scheme : {"ipv4:", "ipv6:"}) {
    if (!absl::StartsWith(peer, scheme)) continue;
    std::string host = peer.substr(std::strlen(scheme));
    const size_t colon = host.rfind(':');
    if (colon != std::string::npos) host.resize(colon);
    return host;
  }
  // Connections a ConnectionGate handed over show as "fd:N": the socket is this process's own.
  if (absl::StartsWith(peer, "fd:")) {
    int fd = -1;
    if (absl::SimpleAtoi(peer.substr(3), &fd)) {
      sockaddr_storage addr{};
      socklen_t len = sizeof addr;
      char host[INET6_ADDRSTRLEN] = {0};
      if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
        if (addr.ss_family == AF_INET &&
            inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&addr)->sin_addr, host,
                      sizeof host) != nullptr) {
          return host;
        }
        if (addr.ss_family == AF_INET6 &&
            inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&addr)->sin6_addr, host,
                      sizeof host) != nullptr) {
          return host;
        }
      }
    }
    return peer;
  }
  // In-process calls come from the node's HTTP front end, which names its client.
  auto it = context.client_metadata().find(kClientMetadata);
  if (it != context.client_metadata().end())
    return std::string(it->second.data(), it->second.size());
  return peer;
}

absl::Status CheckedInferenceService::Authenticate(const grpc::ServerContextBase& context) const {
  if (guards_.api_token.empty()) return absl::OkStatus();
  auto it = context.client_metadata().find("authorization");
  if (it == context.client_metadata().end()) {
    return absl::UnauthenticatedError(
        "this server needs an API token: send `authorization: Bearer <token>`");
  }
  const std::string_view given(it->second.data(), it->second.size());
  const std::string expected = "Bearer " + guards_.api_token;
  // Constant time in the token's contents.
  unsigned char diff = given.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    diff |= static_cast<unsigned char>(expected[i] ^ (i < given.size() ? given[i] : 0));
  }
  if (diff != 0) return absl::UnauthenticatedError("wrong API token");
  return absl::OkStatus();
}

absl::Status CheckedInferenceService::TokenizeOnce(v1::GenerateRequest* request) const {
  if (guards_.tokenizer == nullptr || request->prompt_ids_size() > 0) return absl::OkStatus();
  absl::StatusOr<std::vector<TokenId>> ids = guards_.tokenizer->Encode(request->prompt());
  if (!ids.ok())
    return absl::InvalidArgumentError(absl::StrCat("prompt: ", ids.status().message()));
  request->mutable_prompt_ids()->Assign(ids->begin(), ids->end());
  request->clear_prompt();
  return absl::OkStatus();
}

absl::Status CheckedInferenceService::CheckPromptTokens(const v1::GenerateRequest& request) const {
  if (guards_.max_prompt_tokens == 0) return absl::OkStatus();
  size_t tokens = static_cast<size_t>(request.prompt_ids_size());
  if (request.prompt_ids_size() == 0) {
    if (guards_.tokenizer == nullptr) return absl::OkStatus();  // the consumer counts them
    absl::StatusOr<std::vector<TokenId>> ids = guards_.tokenizer->Encode(request.prompt());
    if (!ids.ok()) return ids.status();
    tokens = ids->size();
  }
  if (tokens > guards_.max_prompt_tokens) {
    return absl::OutOfRangeError(absl::StrCat(
        "prompt: ", tokens, " tokens, over this server's limit of ", guards_.max_prompt_tokens));
  }
  return absl::OkStatus();
}

bool CheckedInferenceService::Enter(const std::string& client) {
  if (guards_.max_requests_per_client == 0) return true;
  absl::MutexLock lock(&mu_);
  uint32_t& running = running_[client];
  if (running >= guards_.max_requests_per_client) {
    if (running == 0) running_.erase(client);
    return false;
  }
  ++running;
  return true;
}

void CheckedInferenceService::Leave(const std::string& client) {
  if (guards_.max_requests_per_client == 0) return;
  absl::MutexLock lock(&mu_);
  auto it = running_.find(client);
  if (it != running_.end() && --it->second == 0) running_.erase(it);
}

absl::StatusOr<v1::GenerateRequest> CheckedInferenceService::Check(
    const grpc::ServerContextBase& context, const grpc::ByteBuffer& raw,
    std::string* request_id) const {
  SCD_RETURN_IF_ERROR(Authenticate(context));
  grpc::Slice slice;
  if (!raw.DumpToSingleSlice(&slice).ok()) return absl::InternalError("cannot read the request");
  const std::string_view bytes(reinterpret_cast<const char*>(slice.begin()), slice.size());
  bool malformed = false;
  if (std::optional<std::string> field =
          FindInvalidUtf8(*v1::GenerateRequest::descriptor(), bytes, &malformed)) {
    return absl::InvalidArgumentError(absl::StrCat(*field, ": not valid UTF-8"));
  }
  v1::GenerateRequest request;
  // Malformed bytes never reach protobuf's parser (which logs a line for some of them).
  if (malformed || !request.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::InvalidArgumentError("the request is not a scd.v1.GenerateRequest");
  }
  *request_id = request.request_id();
  RequestedMode mode;
  SCD_RETURN_IF_ERROR(ValidateGenerateRequest(request, limits_, require_target_, &mode));
  SetRequestMode(mode, &request);  // read once here: the enum alone goes on
  SCD_RETURN_IF_ERROR(TokenizeOnce(&request));
  SCD_RETURN_IF_ERROR(CheckPromptTokens(request));
  return request;
}

EventStream* CheckedInferenceService::Generate(grpc::CallbackServerContext* context,
                                               const grpc::ByteBuffer* raw) {
  std::string request_id;
  absl::StatusOr<v1::GenerateRequest> request = Check(*context, *raw, &request_id);
  if (!request.ok()) return RefusedStream(Refuse(*context, request.status(), request_id));
  const std::string client = ClientOf(*context);
  if (!Enter(client)) {
    return RefusedStream(Refuse(
        *context,
        absl::ResourceExhaustedError(absl::StrCat("client ", ForLog(client, 80), " already has ",
                                                  guards_.max_requests_per_client,
                                                  " requests running (the limit per client)")),
        request_id));
  }
  return backend_->Generate(context, *std::move(request),
                            [this, client](const grpc::Status& status) {
                              Leave(client);
                              // A non-OK end is a refusal as a whole (inference.proto): no event
                              // was written.
                              if (metrics_ != nullptr && !status.ok() &&
                                  status.error_code() != grpc::StatusCode::CANCELLED) {
                                metrics_->CountRefused(FromGrpcStatus(status));
                              }
                            });
}

}  // namespace scd
