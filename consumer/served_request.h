// What the consumer's two request handlers share once a request is checked and routed: its
// public Inference.Generate (a client calling the consumer directly: local prefill) and its
// control plane's Consumer.Decode (the coordinator's routed request). Admission by KV memory
// (waiting in the queue while it does not fit; a caller that goes away leaves it), the run
// (RunTarget) with its events written to the call (metrics observed; a write that fails is the
// caller gone and cancels the run), the log lines and the outcome counts ("request_" + finished,
// cancelled or the error code's name; a refusal: "refused_" + the code's name).
// Thread-safety: ServeRequest runs on the call's handler thread.
#ifndef SCD_CONSUMER_SERVED_REQUEST_H_
#define SCD_CONSUMER_SERVED_REQUEST_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "base/tally.h"
#include "base/token_id.h"
#include "consumer/admission.h"
#include "consumer/request_runner.h"
#include "scd/v1/inference.pb.h"

namespace scd::consumer {

struct ServedRequest {
  const char* handler = "";  // "ConsumerControlService::Decode", ... (exception guard, logs)
  std::string id;            // the request's id, for logs
  const v1::GenerateRequest* request = nullptr;
  TargetRoute route;
  std::vector<TokenId> prompt_ids;  // checked (CheckRequest)
  absl::Time received;              // the call's arrival
  SessionSource session;            // the transfer's session (unset for a local route)
  // Run when the request is cancelled (the caller went away): wakes the session source's wait
  // and ends a session under way (Decode: SessionRouter::Fail of the request's tag).
  std::function<void(const absl::Status& why)> on_cancel;
  // Write the consumer's fallback notice (a second Started) to the call: the coordinator reads it
  // on its control stream (control.proto); a client of the public API never sees one.
  bool announce_fallback = false;
};

// Serves `served` on the call: a refusal at admission is the call's status (no event); else
// every event is written, the terminal one last, and the status is OK, or CANCELLED when the
// caller went away. `outcomes` counts how it ended.
grpc::Status ServeRequest(const ConsumerModel& consumer, Admission& admission, Tally* outcomes,
                          grpc::ServerContext* context,
                          grpc::ServerWriter<v1::GenerateEvent>* writer, ServedRequest served);

}  // namespace scd::consumer

#endif  // SCD_CONSUMER_SERVED_REQUEST_H_
