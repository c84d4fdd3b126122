// What the consumer's two request handlers share once a request is checked and routed: its
// public Inference.Generate (a client calling the consumer directly: local prefill) and its
// control plane's Consumer.Decode (the coordinator's routed request). Admission by KV memory
// (waiting in the queue while it does not fit; a caller that goes away leaves it), the run
// (StartTarget) with its events written to the call (metrics observed; a write that fails is the
// caller gone and cancels the run), the log lines and the outcome counts ("request_" + finished,
// cancelled or the error code's name; a refusal: "refused_" + the code's name).
// ServeOnStream serves it on a callback call's EventStream (serving/event_stream.h): the call's
// cancellation is the request's (gRPC reports a client gone at once: no watch polls for it).
// Names: a request on the consumer is a ServedRequest (what its handler checked and routed),
// served by ServeRequest (admission, the call's writes, the outcome); once admitted its work is
// one TargetRun (consumer/request_runner.h StartTarget: the prefix, the transfer, the decode).
// Thread-safety: no thread waits for a request: ServeRequest returns at once; admission, the
// run's steps (the consumer's step queue), the transfer and the decode advance it on events.
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
#include "serving/event_stream.h"

namespace scd::consumer {

struct ServedRequest {
  const char* handler = "";  // "ConsumerControlService::Decode", ... (exception guard, logs)
  std::string id;            // the request's id, for logs
  v1::GenerateRequest request;
  TargetRoute route;
  std::vector<TokenId> prompt_ids;  // checked (CheckRequest)
  absl::Time received;              // the call's arrival
  // The call's own deadline (a gRPC deadline), when it has one: the request ends at the sooner of
  // it and received + deadline_ms, by this node's clock (not when gRPC's cancel arrives).
  absl::Time call_deadline = absl::InfiniteFuture();
  SessionSource session;            // the transfer's session (unset for a local route)
  // Waits for it without a thread (RunContext::on_session; unset: `session` blocks).
  std::function<void(absl::Duration timeout, std::function<void()> ready)> on_session;
  // Run when the request is cancelled (the caller went away): wakes the session source's wait
  // and ends a session under way (Decode: SessionRouter::Fail of the request's tag).
  std::function<void(const absl::Status& why)> on_cancel;
  // Write the consumer's fallback notice (a second Started) to the call: the coordinator reads it
  // on its control stream (control.proto); a client of the public API never sees one.
  bool announce_fallback = false;
  // Expects a takeover's session (RunContext::take_over; Decode: under the notice's takeover
  // session id) and completes the notice (its session_id); ServeRequest then writes the notice to
  // the call, as the fallback notice. Unset: no takeover.
  std::function<absl::StatusOr<RunContext::Takeover>(v1::GenerateEvent* notice,
                                                     Cancellation* cancellation)>
      take_over;
  // Decode with DecodeRequest.early_prefill: the producer works for the request already, so it
  // must not wait in the admission queue (the producer's pass would wait for its session's ack
  // while the requests ahead of it, admitted, wait for theirs behind that pass). When it would,
  // ServeRequest calls this instead: it refuses the early session, expects the codes under
  // EarlyDeclinedSessionId and clears route.early_prefill (route.early_declined: Started says
  // so, and the coordinator asks the producer once the request is admitted); then the request
  // waits as any other. Unset: the request is not early.
  std::function<absl::Status(ServedRequest* served)> decline_early;
};

// Told once how a served request ended: the call's status (a refusal at admission; else OK, or
// CANCELLED when the caller went away).
using ServeDone = std::function<void(const grpc::Status& status)>;

// Serves `served`: admission (waiting in the queue), then the run (StartTarget, begun as a job on
// the consumer's step queue); its events are written with `write` (on the thread of the step that
// makes them: it must not block), the terminal one last. `done` is called once at the end, after
// what the request held is given back -- at once for a refusal at admission (no event).
// `cancellation`: the call's (a write that fails must cancel it); it and `consumer`, `admission`
// and `outcomes` (counts how it ended) outlive `done`.
void ServeRequest(const ConsumerModel& consumer, Admission& admission, Tally* outcomes,
                  Cancellation* cancellation, EventSink write, ServedRequest served,
                  ServeDone done);

// Serves `served` on a new EventStream (made with `ended`): ServeRequest, the stream ended with
// its status; returns at once (a callback call's reactor must not block). Up to
// kQueuedEvents events are queued before the stream reports itself full (the queue is never cut:
// a request's events are bounded by its max_tokens). REQUIRES: `consumer`, `admission` and
// `outcomes` outlive the call (a server's Shutdown waits for its calls to end).
inline constexpr size_t kQueuedEvents = 64;
EventStream* ServeOnStream(const ConsumerModel& consumer, Admission& admission, Tally* outcomes,
                           EventStream::Ended ended, ServedRequest served);

}  // namespace scd::consumer

#endif  // SCD_CONSUMER_SERVED_REQUEST_H_
