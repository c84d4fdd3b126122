// TransferSession: one request's codes, sent as a header, chunks and a trailer over a Link, with
// the guarantees every backend gets the same way:
//   - backpressure: a sender has at most `max_inflight_bytes` of chunk bytes that the receiver has
//     not yet consumed (the receiver returns Credit as its caller takes chunks);
//   - a deadline, enforced by both sides;
//   - cancel from either side (sender: Cancel frame; receiver: Error frame), on the control lane;
//   - liveness: both ends of a link send heartbeats; a link silent for `liveness_timeout` is dead
//     and every session on it ends kPeerLost (a frozen peer keeps its TCP connection up, so socket
//     errors alone would never tell);
//   - integrity: a CRC-32C on every chunk, checked by the receiver; the protocol major version and
//     the model fingerprints are checked on the header;
//   - exactly one terminal state per session, reported to both sides.
//
// A TransferConnection owns one Link and multiplexes sessions over it (sessions this side sends
// and sessions the peer sends). SessionAcceptor (session_acceptor.h) turns a Listener's links into
// connections and hands out the sessions peers open; session_state.h has the states and counters.
//
// Thread-safety: every class here is thread-safe. One thread at a time should drive a given
// SendSession (SendChunk/Finish) or ReceiveSession (Next); Cancel may come from any thread.
#ifndef SCD_TRANSPORT_TRANSFER_SESSION_H_
#define SCD_TRANSPORT_TRANSFER_SESSION_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "base/pending_call.h"
#include "scd/v1/transfer.pb.h"
#include "transport/link_shaper.h"
#include "transport/session_state.h"
#include "transport/transport.h"

namespace scd::transport {

class ReceiveSession;

struct ConnectionOptions {
  size_t max_inflight_bytes = size_t{64} << 20;  // per sending session
  absl::Duration heartbeat_interval = absl::Milliseconds(200);
  absl::Duration liveness_timeout = absl::Seconds(1);
  // Receiving side: headers naming other fingerprints end the session kFingerprintMismatch
  // (empty = accept any).
  std::string expected_producer_fingerprint;
  std::string expected_consumer_fingerprint;
  // Shape what this side sends (link_shaper.h); disabled by default.
  LinkShape shape;
  std::string name = "transfer";  // for logs
  // Receiving side: called (from the link's thread) with each session a peer opens, instead of
  // queueing it for AcceptSession. SessionAcceptor uses this.
  std::function<void(std::shared_ptr<ReceiveSession>)> on_session;
};

class SendSession : public SessionCore {
 public:
  SendSession(uint64_t id, std::string request_id, std::weak_ptr<TransferConnection> connection,
              size_t max_inflight)
      : SessionCore(id, std::move(request_id)),
        connection_(std::move(connection)),
        max_inflight_(max_inflight) {}

  // Sends one chunk: `chunk` carries the metadata (its payload field empty, payload_bytes and
  // crc32c are filled in here), `payload` the bytes (a view of the caller's memory; its owner is
  // held until the backend has sent it). Blocks while the in-flight limit is reached. Returns the
  // terminal status if the session has ended.
  absl::Status SendChunk(v1::CodeChunk chunk, Payload payload);
  // Sends the trailer and waits for the receiver's ack (or any terminal state) until the deadline.
  absl::Status Finish();
  // Ends the session kCancelled (no-op when already ended) and tells the receiver: the sender's
  // caller called it off.
  void Cancel(const std::string& reason);
  // Ends it kAborted and tells the receiver: the sender gave it up by its own failure (its pass
  // or encoder failed, it stopped), so the receiver may ask another sender for the rest.
  void Abort(const std::string& reason);
  size_t inflight_bytes() const;
  // Waits until at most `bytes` are in flight (the receiver took the rest), the session ended or
  // `deadline` passed; returns the bytes in flight then. What a sender that adapts to the link
  // uses to hand each piece over only when the link is ready for it (codec/rank_governor.h).
  size_t AwaitInflightAtMost(size_t bytes, absl::Time deadline) const;
  // Calls `ready` once, when SendChunk of `bytes` would not wait for credit (or the session
  // ended) -- at once, on the calling thread, when that holds now, else on the thread of the
  // credit or the end that makes it hold. What a sender that holds no thread waits with; a second
  // call replaces a pending `ready`. `ready` must not block.
  void OnRoomFor(size_t bytes, std::function<void()> ready);
  // Whether SendChunk of `bytes` would go without waiting for credit now.
  bool HasRoomFor(size_t bytes) const;

 private:
  friend class TransferConnection;
  bool RoomLocked(size_t bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Calls the pending OnRoomFor `ready` when its room is there (after every credit and the end).
  void NotifyRoom();
  // Cancel and Abort: ends the session in `state` and tells the receiver.
  void End(SessionState state, const std::string& reason);

  std::weak_ptr<TransferConnection> connection_;
  const size_t max_inflight_;
  size_t inflight_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t next_index_ ABSL_GUARDED_BY(mu_) = 0;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  size_t room_for_ ABSL_GUARDED_BY(mu_) = 0;
  PendingCall on_room_ ABSL_GUARDED_BY(mu_);
};

struct ReceivedChunk {
  v1::CodeChunk meta;  // payload field empty; payload_bytes, crc32c as sent
  Payload payload;
  std::optional<uint32_t> payload_crc;  // the backend's checksum of `payload`, when it took one
};

class ReceiveSession : public SessionCore {
 public:
  ReceiveSession(uint64_t id, v1::TransferHeader header,
                 std::weak_ptr<TransferConnection> connection)
      : SessionCore(id, header.request_id()),
        header_(std::move(header)),
        connection_(std::move(connection)) {}

  const v1::TransferHeader& header() const { return header_; }
  // The next chunk in order (CRC checked), or nullopt once the trailer arrived and matched (the
  // session is then completed and the sender acked). Blocks up to `timeout` (DeadlineExceeded
  // when nothing came, the session stays open); the terminal status once the session ended.
  absl::StatusOr<std::optional<ReceivedChunk>> Next(
      absl::Duration timeout = absl::InfiniteDuration());
  // Ends the session kCancelled and tells the sender.
  void Cancel(const std::string& reason);
  size_t queued_chunks() const;
  // Calls `ready` once, when Next(0) would return without waiting: a chunk is queued, the
  // trailer arrived, or the session ended -- at once (on the calling thread) when that holds now,
  // else on the thread of the event that makes it hold (the link's, a timer's, a canceller's).
  // What a receiver that holds no thread waits with; a second call replaces a pending `ready`.
  // `ready` must not block (hand the work to a queue).
  void OnReady(std::function<void()> ready);

 private:
  friend class TransferConnection;
  bool ReadyLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Calls the pending `ready` when Next would no longer wait (after every change of state).
  void NotifyReady();

  const v1::TransferHeader header_;
  std::weak_ptr<TransferConnection> connection_;
  std::deque<ReceivedChunk> queue_ ABSL_GUARDED_BY(mu_);
  std::optional<v1::TransferTrailer> trailer_ ABSL_GUARDED_BY(mu_);
  PendingCall on_ready_ ABSL_GUARDED_BY(mu_);
  uint32_t next_index_ = 0;  // only the thread calling Next touches it
};

// Starts the two threads every connection's tick runs on (once per process; later calls do
// nothing). CreateTransport calls it, so a node has them before its first connection.
void StartConnectionTicks();

class TransferConnection : public LinkHandler,
                           public std::enable_shared_from_this<TransferConnection> {
 public:
  // Takes the link, starts it, and arms its heartbeat/liveness/deadline tick: a timer on the
  // process's clock (base/clock.h) whose work runs on a queue of two threads every connection of
  // the process shares, not on a thread of its own.
  static std::shared_ptr<TransferConnection> Create(std::unique_ptr<Link> link,
                                                    ConnectionOptions options);
  ~TransferConnection() override;

  // Opens a session: fills the header's protocol version and sends it. `timeout` is the whole
  // session's deadline (also sent to the receiver).
  absl::StatusOr<std::shared_ptr<SendSession>> StartSession(v1::TransferHeader header,
                                                            absl::Duration timeout);
  // The next session the peer opened; DeadlineExceeded on timeout, Unavailable once the link is
  // down.
  absl::StatusOr<std::shared_ptr<ReceiveSession>> AcceptSession(absl::Duration timeout);
  // Closes the link; open sessions end kCancelled.
  void Close();
  bool alive() const;
  // The link's shape from now on, for the frames it still holds too (Link::Reshape);
  // UNIMPLEMENTED when the connection was opened unshaped (ConnectionOptions.shape disabled).
  absl::Status Reshape(const LinkShape& shape) { return link_->Reshape(shape); }
  // Sessions not yet ended, both directions.
  size_t open_sessions() const;
  const std::string& describe() const { return describe_; }

  // LinkHandler (called by the link's delivery thread).
  void OnFrame(Frame frame) override;
  void OnLinkDown(absl::Status status) override;

 private:
  friend class SendSession;
  friend class ReceiveSession;
  TransferConnection(std::unique_ptr<Link> link, ConnectionOptions options);
  // One round of the timer's work (liveness, heartbeat, session deadlines), then the next one
  // armed: on the shared tick queue.
  void Tick();
  // Arms the tick for `when` unless one is armed for then or earlier (or the connection stops).
  void ScheduleTickLocked(absl::Time when) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends the frame carrying `message` (its body says which frame type).
  absl::Status SendMessage(const v1::TransferFrame& message, Payload payload = Payload());
  // Ends `session` in `state`; tells the peer (Cancel from a sender, Error from a receiver) when
  // `notify_peer`.
  void EndSend(const std::shared_ptr<SendSession>& session, SessionState state,
               const std::string& message, bool notify_peer);
  void EndReceive(const std::shared_ptr<ReceiveSession>& session, SessionState state,
                  const std::string& message, bool notify_peer);
  void HandleFrame(Frame frame);
  void HandleHeader(uint64_t id, v1::TransferHeader header);
  // Hands a session the peer opened to on_session or the accept queue.
  void Offer(const std::shared_ptr<ReceiveSession>& session);
  void HandleData(uint64_t id, v1::TransferFrame message, Payload payload,
                  std::optional<uint32_t> payload_crc);
  void HandleControl(uint64_t id, const v1::TransferFrame& message);
  void LinkLost(const std::string& why);
  // Drops an ended session from its map; true while the link is up (the peer can be told).
  bool Forget(uint64_t id, bool sending);
  void LogEnd(const char* direction, const SessionCore& session, SessionState state,
              const std::string& message) const;
  // Brackets a link callback (false: the link is being destroyed, do nothing).
  bool EnterCallback(bool touch_liveness);
  void LeaveCallback();
  std::shared_ptr<SendSession> FindSend(uint64_t id);
  std::shared_ptr<ReceiveSession> FindReceive(uint64_t id);

  std::unique_ptr<Link> link_;
  const ConnectionOptions options_;
  const std::string describe_;

  mutable absl::Mutex mu_;
  bool down_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  Clock::Timer tick_timer_ ABSL_GUARDED_BY(mu_);
  absl::Time tick_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();  // when tick_timer_ fires
  // Link callbacks running now; once `link_closing_` is set (destructor) new ones return at once,
  // so none touches link_ while it is being destroyed.
  int callbacks_ ABSL_GUARDED_BY(mu_) = 0;
  bool link_closing_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time last_receive_ ABSL_GUARDED_BY(mu_);
  absl::Time next_heartbeat_ ABSL_GUARDED_BY(mu_);
  // What a lapsed liveness reports, to tell a silent peer from a tick that ran late here: when the
  // tick before ran, and the heartbeats sent since the last frame came.
  absl::Time last_tick_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int beats_since_receive_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_session_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, std::shared_ptr<SendSession>> sending_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::shared_ptr<ReceiveSession>> receiving_ ABSL_GUARDED_BY(mu_);
  std::deque<std::shared_ptr<ReceiveSession>> accept_queue_ ABSL_GUARDED_BY(mu_);
  // Receiving: sessions the sender cancelled before their header arrived (id -> how they end and
  // why; bounded, transfer_connection.cc), and the highest header id seen (concurrent sessions'
  // headers may come slightly out of id order).
  struct EarlyCancel {
    SessionState state;
    std::string why;
  };
  std::map<uint64_t, EarlyCancel> cancelled_before_header_ ABSL_GUARDED_BY(mu_);
  uint64_t last_header_id_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace scd::transport

#endif  // SCD_TRANSPORT_TRANSFER_SESSION_H_
