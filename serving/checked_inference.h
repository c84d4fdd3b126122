// CheckedInferenceService: how every node serves the public scd.v1.Inference API. It stands in
// front of the node's own implementation (a v1::Inference::Service: the coordinator's routing or
// a consumer's model) and takes Generate's request as raw bytes, so that before any work:
//  - a string field that is not valid UTF-8 is refused with INVALID_ARGUMENT naming the field
//    (gRPC's own parsing would end the call with an empty INTERNAL), and bytes that are no
//    GenerateRequest at all likewise;
//  - the request passes ValidateGenerateRequest (proto/request_validation.h) or is refused as a
//    whole with its status (INVALID_ARGUMENT / OUT_OF_RANGE naming the field);
//  - with an API token set, Generate and ListModels need `authorization: Bearer TOKEN` metadata
//    (UNAUTHENTICATED without it or with another; Health stays open, for probes);
//  - a client (its address; for HTTP clients, theirs, as the node's HTTP front end passes it in
//    `x-scd-client` over the in-process channel) runs at most max_requests_per_client calls at
//    once (RESOURCE_EXHAUSTED naming the client and the limit);
//  - the request's mode is read once (proto/wire_mode.h) and goes on as the enum alone;
//  - with a tokenizer, a text prompt is tokenized here, once, and goes on as prompt_ids: the
//    nodes behind this one get ids (range-checked against their vocabulary), never the text --
//    which is why a coordinator refuses nodes whose tokenizer differs from its own;
//  - a prompt over max_prompt_tokens (ids counted; text with the tokenizer) is OUT_OF_RANGE;
// every refusal is logged once with the client's values escaped and counted in `refusals` as
// "refused_<code>" (the node's Stats report it). Health answers carry the build's version.
// ListModels and Health are passed on.
// Generate is served on gRPC's callback API: the checks run on the gRPC thread that delivers the
// call, and the backend returns the call's EventStream (serving/event_stream.h) -- no thread is
// held for an open stream unless the backend holds one.
// Thread-safety: thread-safe as the backend is.
#ifndef SCD_SERVING_CHECKED_INFERENCE_H_
#define SCD_SERVING_CHECKED_INFERENCE_H_

#include <grpcpp/grpcpp.h>

#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "base/tally.h"
#include "google/protobuf/descriptor.h"
#include "proto/request_validation.h"
#include "scd/v1/inference.grpc.pb.h"
#include "serving/event_stream.h"
#include "serving/serving_metrics.h"
#include "tokenizer/tokenizer.h"

namespace scd {

// The build's version ("0.1.0+g<commit>"), as Health reports it.
const char* BuildVersion();

// Counts a refusal of `status`'s code in `refusals` ("refused_invalid_argument", ...).
void CountRefusal(Tally* refusals, const absl::Status& status);

// The first string field (a path such as "targets[1]" or "request.prompt") of a `type` message
// encoded in `bytes` whose value is not valid UTF-8; nullopt when every one is, or when the bytes
// are no well-formed message (then `*malformed`, when given, is set: protobuf's own parser would
// fail on them too). Unknown fields are skipped.
std::optional<std::string> FindInvalidUtf8(const google::protobuf::Descriptor& type,
                                           std::string_view bytes, bool* malformed = nullptr);

// What an operator limits on the public API besides RequestLimits (tools' --api-token-file,
// --max-requests-per-client, --max-prompt-tokens).
struct PublicApiGuards {
  std::string api_token;                 // "" = no token needed
  uint32_t max_requests_per_client = 0;  // 0 = no limit
  uint32_t max_prompt_tokens = 0;        // 0 = the model's room only
  // Tokenizes text prompts at the edge (not owned; null: the text goes on, for the node behind
  // to tokenize).
  const Tokenizer* tokenizer = nullptr;
};

// Metadata the HTTP front end sets on its in-process calls: the HTTP client's address.
inline constexpr char kClientMetadata[] = "x-scd-client";

// What a node serves behind CheckedInferenceService: the coordinator's routing, a consumer's
// model. Thread-safety: called concurrently.
class InferenceBackend {
 public:
  virtual ~InferenceBackend() = default;
  // Serves the checked `request` on the call: returns the call's stream, made with `ended` (the
  // front's accounting, run once when the call is done). A refusal as a whole is a stream that
  // ends with the refusal's status and no event.
  virtual EventStream* Generate(grpc::CallbackServerContext* context, v1::GenerateRequest request,
                                EventStream::Ended ended) = 0;
  virtual grpc::Status ListModels(v1::ListModelsResponse* response) = 0;
  virtual grpc::Status Health(v1::HealthResponse* response) = 0;
};

// A stream that ends at once with `status` (no event): a refusal.
EventStream* RefusedStream(grpc::Status status, EventStream::Ended ended = nullptr);

class CheckedInferenceService final : public grpc::Service {
 public:
  // REQUIRES: `backend` and `refusals` (may be null) outlive this one.
  // `metrics` (may be null) counts refused calls (scd:request_failures_total{reason="refused"}).
  CheckedInferenceService(InferenceBackend* backend, RequestLimits limits, bool require_target,
                          Tally* refusals, ServingMetrics* metrics = nullptr,
                          PublicApiGuards guards = {});

 private:
  EventStream* Generate(grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw);
  // The checks before the backend runs: the request, or the refusal's status.
  absl::StatusOr<v1::GenerateRequest> Check(const grpc::ServerContextBase& context,
                                            const grpc::ByteBuffer& raw,
                                            std::string* request_id) const;
  grpc::Status Refuse(const grpc::ServerContextBase& context, const absl::Status& status,
                      const std::string& request_id);
  absl::Status Authenticate(const grpc::ServerContextBase& context) const;
  absl::Status CheckPromptTokens(const v1::GenerateRequest& request) const;
  // A text prompt as ids, with the tokenizer (else as it is).
  absl::Status TokenizeOnce(v1::GenerateRequest* request) const;
  // Counts the call against its client; false (nothing counted) when the client is at its limit.
  bool Enter(const std::string& client);
  void Leave(const std::string& client);

  InferenceBackend* const backend_;
  const RequestLimits limits_;
  const bool require_target_;
  Tally* const refusals_;
  ServingMetrics* const metrics_;
  const PublicApiGuards guards_;
  absl::Mutex mu_;
  std::map<std::string, uint32_t> running_ ABSL_GUARDED_BY(mu_);  // calls per client
};

// The client a call is from: the peer's host, or for in-process calls the x-scd-client value.
std::string ClientOf(const grpc::ServerContextBase& context);

}  // namespace scd

#endif  // SCD_SERVING_CHECKED_INFERENCE_H_
