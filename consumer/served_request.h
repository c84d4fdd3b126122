// What the consumer's two request handlers share once a request is checked and routed: its
// public Inference.Generate (a client calling the consumer directly: local prefill) and its
// control plane's Consumer.Decode (the coordinator's routed request). Admission by KV memory
// (waiting in the queue while it does not fit; a caller that goes away leaves it), the run
// (RunTarget) with its events written to the call (metrics observed; a write that fails is the
// caller gone and cancels the run), the log lines and the outcome counts ("request_" + finished,
// cancelled or the error code's name; a refusal: "refused_" + the code's name).
// ServeOnStream serves it on a callback call's EventStream (proto/event_stream.h): the call's
// cancellation is the request's (gRPC reports a client gone at once: no watch polls for it).
// Thread-safety: ServeRequest blocks the calling thread until the request ends; ServeOnStream
// runs it on a thread of its own and returns at once.
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
#include "proto/event_stream.h"
#include "scd/v1/inference.pb.h"

namespace scd::consumer {

struct ServedRequest {
  const char* handler = "";  // "ConsumerControlService::Decode", ... (exception guard, logs)
  std::string id;            // the request's id, for logs
  v1::GenerateRequest request;
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

// Serves `served`: a refusal at admission is the returned status (no event); else every event
// is written with `write`, the terminal one last, and the status is OK, or CANCELLED when the
// caller went away (`cancellation`: the call's, cancelled then; a write that fails cancels it).
// `outcomes` counts how it ended.
grpc::Status ServeRequest(const ConsumerModel& consumer, Admission& admission, Tally* outcomes,
                          Cancellation* cancellation, const EventSink& write, ServedRequest served);

// Serves `served` on a new EventStream (made with `ended`), from a thread of its own; the stream
// is ended with ServeRequest's status. REQUIRES: `consumer`, `admission` and `outcomes` outlive
// the call (a server's Shutdown waits for its calls to end).
EventStream* ServeOnStream(const ConsumerModel& consumer, Admission& admission, Tally* outcomes,
                           EventStream::Ended ended, ServedRequest served);

}  // namespace scd::consumer

#endif  // SCD_CONSUMER_SERVED_REQUEST_H_
