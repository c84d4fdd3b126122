// The state every transfer session has, on either side: its terminal states and their codes, the
// protocol version, byte and time counters, and SessionCore (one terminal state, waiting for it).
// The sessions and the connection that drives them: transfer_session.h.
// Thread-safety: SessionCore is thread-safe; the rest are values and pure functions.
#ifndef SCD_TRANSPORT_SESSION_STATE_H_
#define SCD_TRANSPORT_SESSION_STATE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "scd/v1/transfer.pb.h"

namespace scd::transport {

constexpr uint32_t kProtocolMajor = 1;
constexpr uint32_t kProtocolMinor = 0;

enum class SessionState {
  kOpen,
  kCompleted,
  kCancelled,
  kDeadlineExceeded,
  kPeerLost,
  kCorrupt,
  kVersionMismatch,
  kFingerprintMismatch,
  kResourceExhausted,
  kProtocolError,
  kInternal,
  kAborted,  // the sender gave it up by its own failure (kCancelled: its caller called it off)
};
const char* SessionStateName(SessionState state);
// The absl code each terminal state maps to (Cancelled, DeadlineExceeded, Unavailable, DataLoss,
// FailedPrecondition, PermissionDenied, ResourceExhausted, InvalidArgument, Internal, Aborted).
absl::StatusCode SessionStateCode(SessionState state);

struct SessionStats {
  uint64_t bytes = 0;  // chunk payload + scale bytes
  uint64_t chunks = 0;
  absl::Time start;                              // header sent / received
  absl::Time first_byte = absl::InfinitePast();  // first chunk sent / received
  absl::Time last_byte = absl::InfinitePast();   // last chunk sent / received
  absl::Time end = absl::InfinitePast();         // terminal state reached
  size_t max_inflight_bytes = 0;  // sender: the most unconsumed bytes it ever had out
  // bytes / (last_byte - start), in Gbit/s; 0 before any byte.
  double goodput_gbps() const;
};

// The protocol's error code for a terminal state, and back.
v1::ErrorCode ErrorCodeFor(SessionState state);
SessionState StateFor(v1::ErrorCode code);
// The state a sender's Cancel ends the receiving session in: kDeadlineExceeded, kAborted (the
// sender's own failure) or kCancelled (its caller called it off; any other reason too).
SessionState CancelStateFor(v1::ErrorCode reason);

class TransferConnection;

// The state both session kinds share: terminal state, stats, waiting.
class SessionCore : public std::enable_shared_from_this<SessionCore> {
 public:
  virtual ~SessionCore() = default;
  SessionCore(uint64_t id, std::string request_id) : id_(id), request_id_(std::move(request_id)) {}
  uint64_t id() const { return id_; }
  const std::string& request_id() const { return request_id_; }
  SessionState state() const;
  // OK when completed, else the terminal state's status (its message names what happened).
  absl::Status status() const;
  SessionStats stats() const;
  // Waits for a terminal state; false on timeout.
  bool WaitForEnd(absl::Duration timeout) const;

 protected:
  friend class TransferConnection;
  absl::Status StatusLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves to `state` unless already terminal; true when this call ended the session.
  bool EndLocked(SessionState state, std::string message) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t id_;
  const std::string request_id_;
  mutable absl::Mutex mu_;
  SessionState state_ ABSL_GUARDED_BY(mu_) = SessionState::kOpen;
  std::string message_ ABSL_GUARDED_BY(mu_);
  SessionStats stats_ ABSL_GUARDED_BY(mu_);
  absl::Time deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
};

}  // namespace scd::transport

#endif  // SCD_TRANSPORT_SESSION_STATE_H_
