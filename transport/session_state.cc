#include "transport/session_state.h"

#include "absl/strings/str_cat.h"

namespace scd::transport {

v1::ErrorCode ErrorCodeFor(SessionState state) {
  switch (state) {
    case SessionState::kCancelled:
      return v1::ERROR_CANCELLED;
    case SessionState::kDeadlineExceeded:
      return v1::ERROR_DEADLINE_EXCEEDED;
    case SessionState::kPeerLost:
      return v1::ERROR_PEER_LOST;
    case SessionState::kCorrupt:
      return v1::ERROR_CORRUPT;
    case SessionState::kVersionMismatch:
      return v1::ERROR_VERSION_MISMATCH;
    case SessionState::kFingerprintMismatch:
      return v1::ERROR_FINGERPRINT_MISMATCH;
    case SessionState::kResourceExhausted:
      return v1::ERROR_RESOURCE_EXHAUSTED;
    case SessionState::kProtocolError:
      return v1::ERROR_PROTOCOL;
    case SessionState::kAborted:
      return v1::ERROR_ABORTED;
    default:
      return v1::ERROR_INTERNAL;
  }
}

SessionState StateFor(v1::ErrorCode code) {
  switch (code) {
    case v1::ERROR_CANCELLED:
      return SessionState::kCancelled;
    case v1::ERROR_DEADLINE_EXCEEDED:
      return SessionState::kDeadlineExceeded;
    case v1::ERROR_PEER_LOST:
      return SessionState::kPeerLost;
    case v1::ERROR_CORRUPT:
      return SessionState::kCorrupt;
    case v1::ERROR_VERSION_MISMATCH:
      return SessionState::kVersionMismatch;
    case v1::ERROR_FINGERPRINT_MISMATCH:
      return SessionState::kFingerprintMismatch;
    case v1::ERROR_RESOURCE_EXHAUSTED:
      return SessionState::kResourceExhausted;
    case v1::ERROR_PROTOCOL:
      return SessionState::kProtocolError;
    case v1::ERROR_ABORTED:
      return SessionState::kAborted;
    default:
      return SessionState::kInternal;
  }
}

SessionState CancelStateFor(v1::ErrorCode reason) {
  switch (reason) {
    case v1::ERROR_DEADLINE_EXCEEDED:
      return SessionState::kDeadlineExceeded;
    case v1::ERROR_ABORTED:
      return SessionState::kAborted;
    default:
      return SessionState::kCancelled;
  }
}

const char* SessionStateName(SessionState state) {
  switch (state) {
    case SessionState::kOpen:
      return "open";
    case SessionState::kCompleted:
      return "completed";
    case SessionState::kCancelled:
      return "cancelled";
    case SessionState::kDeadlineExceeded:
      return "deadline exceeded";
    case SessionState::kPeerLost:
      return "peer lost";
    case SessionState::kCorrupt:
      return "corrupt";
    case SessionState::kVersionMismatch:
      return "version mismatch";
    case SessionState::kFingerprintMismatch:
      return "fingerprint mismatch";
    case SessionState::kResourceExhausted:
      return "resource exhausted";
    case SessionState::kProtocolError:
      return "protocol error";
    case SessionState::kInternal:
      return "internal error";
    case SessionState::kAborted:
      return "aborted";
  }
  return "unknown";
}

absl::StatusCode SessionStateCode(SessionState state) {
  switch (state) {
    case SessionState::kOpen:
    case SessionState::kCompleted:
      return absl::StatusCode::kOk;
    case SessionState::kCancelled:
      return absl::StatusCode::kCancelled;
    case SessionState::kDeadlineExceeded:
      return absl::StatusCode::kDeadlineExceeded;
    case SessionState::kPeerLost:
      return absl::StatusCode::kUnavailable;
    case SessionState::kCorrupt:
      return absl::StatusCode::kDataLoss;
    case SessionState::kVersionMismatch:
      return absl::StatusCode::kFailedPrecondition;
    case SessionState::kFingerprintMismatch:
      return absl::StatusCode::kPermissionDenied;
    case SessionState::kResourceExhausted:
      return absl::StatusCode::kResourceExhausted;
    case SessionState::kProtocolError:
      return absl::StatusCode::kInvalidArgument;
    case SessionState::kInternal:
      return absl::StatusCode::kInternal;
    case SessionState::kAborted:
      return absl::StatusCode::kAborted;
  }
  return absl::StatusCode::kInternal;
}

double SessionStats::goodput_gbps() const {
  if (bytes == 0 || last_byte <= start) return 0.0;
  return static_cast<double>(bytes) * 8.0 / absl::ToDoubleSeconds(last_byte - start) / 1e9;
}

// ---- SessionCore -------------------------------------------------------------------------------

SessionState SessionCore::state() const {
  absl::MutexLock lock(&mu_);
  return state_;
}

absl::Status SessionCore::status() const {
  absl::MutexLock lock(&mu_);
  return StatusLocked();
}

absl::Status SessionCore::StatusLocked() const {
  if (state_ == SessionState::kOpen) return absl::UnknownError("session still open");
  if (state_ == SessionState::kCompleted) return absl::OkStatus();
  return absl::Status(SessionStateCode(state_),
                      absl::StrCat("transfer session ", request_id_, " ", SessionStateName(state_),
                                   ": ", message_));
}

SessionStats SessionCore::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

bool SessionCore::WaitForEnd(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto ended = [this]()
                   ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return state_ != SessionState::kOpen; };
  return mu_.AwaitWithTimeout(absl::Condition(&ended), timeout);
}

bool SessionCore::EndLocked(SessionState state, std::string message) {
  if (state_ != SessionState::kOpen) return false;
  state_ = state;
  message_ = std::move(message);
  stats_.end = absl::Now();
  return true;
}

}  // namespace scd::transport
