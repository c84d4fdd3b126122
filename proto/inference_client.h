// A client of the public scd.v1.Inference API, for the command line and tests: one Generate call
// streamed event by event.
// Thread-safety: reentrant.
#ifndef SCD_PROTO_INFERENCE_CLIENT_H_
#define SCD_PROTO_INFERENCE_CLIENT_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "scd/v1/inference.pb.h"

namespace scd {

// Channels use the process's TLS settings (base/grpc_tls.h); calls carry $SCD_API_TOKEN, when
// set, as `authorization: Bearer TOKEN`.
// Calls Generate on `server` and hands every event to `on_event` as it arrives. Returns the RPC's
// status (a request refused as a whole: NOT_FOUND, RESOURCE_EXHAUSTED, ...; UNAVAILABLE when the
// server cannot be reached).
absl::Status StreamGenerate(const std::string& server, const v1::GenerateRequest& request,
                            absl::Duration timeout,
                            const std::function<void(const v1::GenerateEvent&)>& on_event);

// Whether a Generate call that ended with `status` before its stream's terminal event broke on the
// way -- UNAVAILABLE, CANCELLED, ABORTED or UNKNOWN: its coordinator went away -- so that the
// stream may resume through another coordinator (a refusal or a deadline may not).
bool IsResumableBreak(const absl::Status& status);
// `request` to send through another coordinator to resume its stream: with the stream's resume
// token (its Started's) and every output id received so far.
v1::GenerateRequest ResumeRequest(const v1::GenerateRequest& request, const std::string& token,
                                  const std::vector<int32_t>& received);

// StreamGenerate over a deployment's coordinators, resuming (GenerateRequest.resume_token): the
// request goes to servers[0]; when its call breaks -- it ends UNAVAILABLE, CANCELLED, ABORTED or
// UNKNOWN -- each target whose Started carried a resume token and whose Finished or Error has
// not come is sent again alone, with its token and every output id received for it, to the next
// server (in order, wrapping; at most servers.size() resumes per target), a fan-out's targets at
// once, so `on_event` sees one stream per target: the resumed part opens with a Moved event
// (resumed) and ends with the one Finished. `on_event` is called one event at a time (from a
// resuming target's own thread for a fan-out). A request refused as a whole by the first server,
// or a target that broke before its Started, ends as StreamGenerate's would (that call's status);
// else the status is the first resumed target's failure, or OK. `resumes` (may be null) counts
// the resumes made. The overall `timeout` bounds every call. `call` makes each call (null:
// StreamGenerate; tests break one on purpose).
using GenerateCall = std::function<absl::Status(
    const std::string& server, const v1::GenerateRequest& request, absl::Duration timeout,
    const std::function<void(const v1::GenerateEvent&)>& on_event)>;
absl::Status StreamGenerateResuming(const std::vector<std::string>& servers,
                                    const v1::GenerateRequest& request, absl::Duration timeout,
                                    const std::function<void(const v1::GenerateEvent&)>& on_event,
                                    int* resumes = nullptr, const GenerateCall& call = nullptr);

// Every model the server routes to (Inference.ListModels).
absl::StatusOr<std::vector<v1::ModelInfo>> ListModels(const std::string& server,
                                                      absl::Duration timeout);

}  // namespace scd

#endif  // SCD_PROTO_INFERENCE_CLIENT_H_
