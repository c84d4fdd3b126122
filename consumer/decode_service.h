// The consumer's side of the control plane (scd.v1.Consumer.Decode, called by the coordinator):
// admit the routed request (its KV memory reserved before the producer sends, waiting in the
// admission queue while it does not fit; consumer/admission.h), expect its transfer session at
// the SessionRouter, then run it (StartTarget): rebuild the prefix layer by layer from the
// producer's codes, decode in the consumer's batch, stream events. A mode that needs an
// artifact the consumer does not hold is FAILED_PRECONDITION, naming the artifact. A caller that
// goes away (the coordinator cancels: its client left) ends the transfer within ~30 ms, which
// tells the producer to stop sending. Every call must carry the cluster secret (UNAUTHENTICATED
// otherwise); the transfer session is expected under the coordinator's session_id (random), never
// the client's request_id. The model-dependent checks (CheckRequest) run before admission: a
// refusal ends the call with its status and no event.
// Thread-safety: thread-safe; calls are served on gRPC's callback API (ServeOnStream:
// consumer/served_request.h says which parts of a request hold a thread).
#ifndef SCD_CONSUMER_DECODE_SERVICE_H_
#define SCD_CONSUMER_DECODE_SERVICE_H_

#include <map>
#include <memory>
#include <string>

#include "base/tally.h"
#include "codec/artifact.h"
#include "consumer/admission.h"
#include "consumer/request_runner.h"
#include "consumer/served_request.h"
#include "consumer/session_router.h"
#include "proto/cluster_secret.h"
#include "scd/v1/control.grpc.pb.h"

namespace scd::consumer {

class ConsumerControlService final
    : public v1::Consumer::WithCallbackMethod_Decode<v1::Consumer::Service> {
 public:
  // REQUIRES: everything pointed to outlives the service. `artifacts`: by artifact id.
  ConsumerControlService(ConsumerModel consumer, std::map<std::string, const Artifact*> artifacts,
                         std::shared_ptr<Admission> admission, SessionRouter* router,
                         ClusterSecret secret);

  grpc::ServerWriteReactor<v1::GenerateEvent>* Decode(grpc::CallbackServerContext* context,
                                                      const v1::DecodeRequest* request) override;
  // The coordinator reports that the producer will not send (or finish) a request's session
  // (its Prefill call failed): the request stops waiting for it (SessionRouter::Fail) and falls
  // back or ends now. NOT_FOUND for another target's session.
  grpc::Status TransferFailed(grpc::ServerContext* context,
                              const v1::TransferFailedRequest* request,
                              v1::TransferFailedResponse* response) override;
  // Admitted requests, capacity, open transfer sessions, the admission queue and KV bytes reserved,
  // the scheduler's sequences and steps, how requests ended ("request_" +
  // finished / cancelled / the error code's name) and how many were refused before any work
  // ("refused_" + the code's name, on either plane).
  grpc::Status Stats(grpc::ServerContext* context, const v1::StatsRequest* request,
                     v1::NodeStats* stats) override;
  // What Stats answers, without the secret check (the node's /metrics collector).
  void FillStats(v1::NodeStats* stats) const;
  // Where the node's public API counts its refusals too (reported by Stats).
  Tally* tally() { return &ended_; }

 private:
  // The checks and the route of a Decode: what ServeRequest serves, or the refusal.
  absl::StatusOr<ServedRequest> Route(const v1::DecodeRequest* request, absl::Time received);
  grpc::Status Refuse(const std::string& id, const absl::Status& status);

  const ConsumerModel consumer_;
  const std::map<std::string, const Artifact*> artifacts_;
  const std::shared_ptr<Admission> admission_;
  SessionRouter* const router_;
  const ClusterSecret secret_;
  Tally ended_;
};

}  // namespace scd::consumer

#endif  // SCD_CONSUMER_DECODE_SERVICE_H_
