// Resume tokens (issue 50): a coordinator gives a stream's client, in each target's Started, a
// token that lets the client resume that target's stream through any coordinator of the
// deployment once its own went away (GenerateRequest.resume_token, inference.proto). The token
// (v1::ResumeToken, opaque to clients) carries the request id, the target, the absolute deadline,
// an expiry and the mode the stream started in, with an HMAC-SHA256 under the cluster secret over
// those, the request as the client sent it (less request_id, deadline_ms and the resume fields: a
// client sends the same request again), its tenant (cache_salt, inside the request) and the API
// token it came with. So no coordinator needs another's state, a request id alone resumes nothing,
// and a token of one request, tenant or API token resumes no other. Every refusal reads the same
// (PERMISSION_DENIED kResumeRefused), so a client cannot probe what was wrong.
// Thread-safety: stateless functions.
#ifndef SCD_COORDINATOR_RESUME_TOKEN_H_
#define SCD_COORDINATOR_RESUME_TOKEN_H_

#include <grpcpp/grpcpp.h>

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "codec/transfer_mode.h"
#include "proto/cluster_secret.h"
#include "scd/v1/inference.pb.h"

namespace scd::coordinator {

inline constexpr char kResumeRefused[] = "resume refused";

// What a valid token grants: the stream it resumes.
struct ResumeGrant {
  std::string request_id;
  std::string target;  // the one target it resumes (one of the request's)
  absl::Time deadline;
  TransferMode mode = TransferMode::kLocal;
  std::string mac;  // the token's identity (the once-per-position check keys on it)
};

// The token for `target`'s stream of `request` as the coordinator serves it (request_id set),
// presented with `api_token` ("" when none), which started in `mode` and must end by `deadline`;
// it expires at the deadline.
std::string IssueResumeToken(const ClusterSecret& secret, const v1::GenerateRequest& request,
                             std::string_view api_token, absl::Time deadline, TransferMode mode,
                             const std::string& target);

// The grant of `request.resume_token()` for `request` as re-sent with `api_token`, at `now`;
// PERMISSION_DENIED kResumeRefused for a token that does not parse, was not made with this secret
// for this request, tenant and API token, names no target of the request, or has expired.
absl::StatusOr<ResumeGrant> CheckResumeToken(const ClusterSecret& secret,
                                             const v1::GenerateRequest& request,
                                             std::string_view api_token, absl::Time now);

// The API token a call presented (its `authorization` metadata, "" without one): what a token is
// bound to.
std::string PresentedApiToken(const grpc::ServerContextBase& context);

}  // namespace scd::coordinator

#endif  // SCD_COORDINATOR_RESUME_TOKEN_H_
