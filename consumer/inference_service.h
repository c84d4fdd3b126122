// The consumer's own scd.v1.Inference service: Generate on this consumer's model, ListModels,
// Health. Called directly (not through the coordinator) a consumer has no producer, so it serves
// mode local (and auto, which resolves to local, saying so); a request naming another target is
// NOT_FOUND (naming this one), a mode that needs a producer FAILED_PRECONDITION. Requests are
// admitted first by KV memory (consumer/admission.h: waiting in its queue; RESOURCE_EXHAUSTED when
// it can never fit or the queue is full, UNAVAILABLE while draining); every admitted
// request ends in exactly one terminal event, and a client that cancels ends it "cancelled" with
// its slot released. Logs carry the request id (escaped, cut); an id the client left empty is a
// random one. The model-dependent checks (CheckRequest) run before admission; every refusal is
// counted in `refusals` ("refused_<code>"). Served behind CheckedInferenceService, which
// validates the request (proto/request_validation.h) before it gets here.
// Thread-safety: thread-safe; calls are served on gRPC's callback API (ServeOnStream:
// consumer/served_request.h says which parts of a request hold a thread).
#ifndef SCD_CONSUMER_INFERENCE_SERVICE_H_
#define SCD_CONSUMER_INFERENCE_SERVICE_H_

#include <atomic>
#include <memory>
#include <string>

#include "base/tally.h"
#include "consumer/admission.h"
#include "consumer/request_runner.h"
#include "scd/v1/inference.grpc.pb.h"
#include "serving/checked_inference.h"

namespace scd::consumer {

class ConsumerInferenceService final : public InferenceBackend {
 public:
  // REQUIRES: the model and tokenizer in `consumer` outlive the service.
  // `refusals` (may be null) outlives the service.
  ConsumerInferenceService(ConsumerModel consumer, std::string fingerprint,
                           std::shared_ptr<Admission> admission, Tally* refusals = nullptr);

  EventStream* Generate(grpc::CallbackServerContext* context, v1::GenerateRequest request,
                        EventStream::Ended ended) override;
  grpc::Status ListModels(v1::ListModelsResponse* response) override;
  grpc::Status Health(v1::HealthResponse* response) override;

  const std::shared_ptr<Admission>& admission() const { return admission_; }

 private:
  const ConsumerModel consumer_;
  const std::string fingerprint_;
  const std::shared_ptr<Admission> admission_;
  Tally* const refusals_;
};

}  // namespace scd::consumer

#endif  // SCD_CONSUMER_INFERENCE_SERVICE_H_
