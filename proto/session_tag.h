// Session tags: how a producer's transfer session names the request and target it is for, so
// the consumer hands it to the request expecting it (consumer/session_router.h).
// Header-only (the coordinator derives ids too, without the codec's framing).
// Thread-safety: pure functions.
#ifndef SCD_PROTO_SESSION_TAG_H_
#define SCD_PROTO_SESSION_TAG_H_

#include <string>

#include "absl/strings/str_cat.h"

namespace scd {

// The tag a producer puts in TransferHeader.request_id for one target of one request's session
// id; the consumer hands the session to the request expecting that tag.
inline std::string SessionTag(const std::string& session_id, const std::string& target) {
  return absl::StrCat(session_id, "#", target);
}

// The session id a request's codes travel under after its consumer declined the early prefill
// (Started.early_prefill_declined): the first id's tag is ended on the consumer by then.
inline std::string EarlyDeclinedSessionId(const std::string& session_id) {
  return absl::StrCat(session_id, "~declined");
}

// The session id the rest of a transfer travels under when another producer takes it over
// (GenerateEvent.transfer_lost): the `takeover`-th (1, 2, ...) after `session_id`'s was lost.
inline std::string TakeoverSessionId(const std::string& session_id, uint32_t takeover) {
  return absl::StrCat(session_id, "~takeover", takeover);
}

}  // namespace scd

#endif  // SCD_PROTO_SESSION_TAG_H_
