#include "coordinator/resume_token.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/sha256.h"
#include "proto/wire_mode.h"

namespace scd::coordinator {
namespace {

// The request as signed: what a client sends again unchanged (its request id may have been made
// by the coordinator, its relative deadline is the token's absolute one).
std::string SignedRequest(const v1::GenerateRequest& request) {
  v1::GenerateRequest signed_part = request;
  signed_part.clear_request_id();
  signed_part.clear_deadline_ms();
  signed_part.clear_resume_token();
  signed_part.clear_resume_received_ids();
  std::string bytes;
  google::protobuf::io::StringOutputStream out(&bytes);
  google::protobuf::io::CodedOutputStream coded(&out);
  coded.SetSerializationDeterministic(true);
  signed_part.SerializeToCodedStream(&coded);
  coded.Trim();
  return bytes;
}

// Each field length-prefixed, so no two claim sets read the same.
std::string Mac(const ClusterSecret& secret, const v1::ResumeToken& token,
                const v1::GenerateRequest& request, std::string_view api_token) {
  std::string claims = "scd-resume-v1";
  const std::string api_token_hash = Sha256Hex(api_token);
  const std::string signed_request = SignedRequest(request);
  for (const std::string* field :
       {&token.request_id(), &token.target(), &api_token_hash, &signed_request}) {
    absl::StrAppend(&claims, "|", field->size(), ":", *field);
  }
  absl::StrAppend(&claims, "|", token.deadline_unix_ms(), "|", token.expires_unix_ms(), "|",
                  static_cast<int>(token.transfer_mode()));
  return HmacSha256(secret.value(), claims);
}

}  // namespace

std::string IssueResumeToken(const ClusterSecret& secret, const v1::GenerateRequest& request,
                             std::string_view api_token, absl::Time deadline, TransferMode mode,
                             const std::string& target) {
  v1::ResumeToken token;
  token.set_request_id(request.request_id());
  token.set_target(target);
  token.set_deadline_unix_ms(absl::ToUnixMillis(deadline));
  token.set_expires_unix_ms(absl::ToUnixMillis(deadline));
  token.set_transfer_mode(ToWire(mode));
  token.set_mac(Mac(secret, token, request, api_token));
  return token.SerializeAsString();
}

absl::StatusOr<ResumeGrant> CheckResumeToken(const ClusterSecret& secret,
                                             const v1::GenerateRequest& request,
                                             std::string_view api_token, absl::Time now) {
  const absl::Status refused = absl::PermissionDeniedError(kResumeRefused);
  v1::ResumeToken token;
  if (!token.ParseFromString(request.resume_token()) || token.mac().empty()) return refused;
  // The MAC first, whatever else is wrong: the same work for every refusal.
  const bool genuine = EqualInConstantTime(token.mac(), Mac(secret, token, request, api_token));
  if (!genuine || now >= absl::FromUnixMillis(token.expires_unix_ms())) return refused;
  if (std::find(request.targets().begin(), request.targets().end(), token.target()) ==
      request.targets().end()) {
    return refused;
  }
  v1::GenerateRequest as_mode;
  as_mode.set_transfer_mode(token.transfer_mode());
  absl::StatusOr<RequestedMode> mode = RequestModeOf(as_mode);
  if (!mode.ok() || mode->is_auto()) return refused;
  ResumeGrant grant;
  grant.request_id = token.request_id();
  grant.target = token.target();
  grant.deadline = absl::FromUnixMillis(token.deadline_unix_ms());
  grant.mode = mode->mode();
  grant.mac = token.mac();
  return grant;
}

std::string PresentedApiToken(const grpc::ServerContextBase& context) {
  auto it = context.client_metadata().find("authorization");
  if (it == context.client_metadata().end()) return "";
  return std::string(it->second.data(), it->second.size());
}

}  // namespace scd::coordinator
