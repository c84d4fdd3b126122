// TransferConnection: one link, the sessions on it in both directions, heartbeats, liveness and
// deadlines (transfer_session.h declares it with the sessions it drives).
//
// Locking: a connection's mu_ and a session's mu_ are never held together (collect under one,
// act under the other), and no lock is held while calling into the link, so a backend that
// delivers synchronously cannot deadlock us.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "base/change_notice.h"
#include "base/release_clock.h"
#include "base/status_macros.h"
#include "base/work_queue.h"
#include "transport/frame_message.h"
#include "transport/transfer_session.h"

namespace scd::transport {
namespace {
// Cancels remembered ahead of their header: ids at most this far from the newest header, and at
// most this many of them.
constexpr uint64_t kEarlyCancelWindow = 1024;
constexpr size_t kMaxReasonBytes = 512;  // of a remembered Cancel's reason
}  // namespace

// ---- TransferConnection ------------------------------------------------------------------------

TransferConnection::TransferConnection(std::unique_ptr<Link> link, ConnectionOptions options)
    : link_(ShapeLink(std::move(link), options.shape)),
      options_(std::move(options)),
      describe_(absl::StrCat(options_.name, " over ", link_->Describe())) {}

std::shared_ptr<TransferConnection> TransferConnection::Create(std::unique_ptr<Link> link,
                                                               ConnectionOptions options) {
  std::shared_ptr<TransferConnection> connection(
      new TransferConnection(std::move(link), std::move(options)));
  {
    absl::MutexLock lock(&connection->mu_);
    connection->last_receive_ = absl::Now();
    connection->next_heartbeat_ = absl::Now();
  }
  connection->link_->Start(connection.get());
  {
    absl::MutexLock lock(&connection->mu_);
    connection->ScheduleTickLocked(absl::Now());
  }
  return connection;
}

TransferConnection::~TransferConnection() {
  Close();
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    tick_timer_.Reset();  // a tick already queued finds the connection gone (its weak pointer)
  }
  {
    absl::MutexLock lock(&mu_);
    link_closing_ = true;
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return callbacks_ == 0; };
    mu_.Await(absl::Condition(&idle));
  }
  link_.reset();  // joins the backend's delivery; callbacks arriving meanwhile return at once
}

bool TransferConnection::EnterCallback(bool touch_liveness) {
  absl::MutexLock lock(&mu_);
  if (link_closing_) return false;
  ++callbacks_;
  if (touch_liveness) {
    last_receive_ = absl::Now();
    beats_since_receive_ = 0;
  }
  return true;
}

void TransferConnection::LeaveCallback() {
  absl::MutexLock lock(&mu_);
  --callbacks_;
}

absl::Status TransferConnection::SendMessage(const v1::TransferFrame& message, Payload payload) {
  SCD_ASSIGN_OR_RETURN(Frame frame, FrameFromMessage(message, std::move(payload)));
  return link_->Send(std::move(frame));
}

absl::StatusOr<std::shared_ptr<SendSession>> TransferConnection::StartSession(
    v1::TransferHeader header, absl::Duration timeout) {
  header.set_protocol_major(header.protocol_major() == 0 ? kProtocolMajor
                                                         : header.protocol_major());
  header.set_protocol_minor(kProtocolMinor);
  if (timeout < absl::InfiniteDuration()) {
    header.set_deadline_ms(
        static_cast<uint32_t>(std::max<int64_t>(1, absl::ToInt64Milliseconds(timeout))));
  }
  std::shared_ptr<SendSession> session;
  {
    absl::MutexLock lock(&mu_);
    if (down_) return absl::UnavailableError(absl::StrCat(describe_, " is down"));
    const uint64_t id = next_session_id_++;
    session = std::make_shared<SendSession>(id, header.request_id(), weak_from_this(),
                                            options_.max_inflight_bytes);
    sending_[id] = session;
    NoteChange();
  }
  {
    absl::MutexLock lock(&session->mu_);
    session->stats_.start = absl::Now();
    session->deadline_ =
        timeout < absl::InfiniteDuration() ? absl::Now() + timeout : absl::InfiniteFuture();
  }
  v1::TransferFrame message;
  message.set_session_id(session->id());
  *message.mutable_header() = std::move(header);
  absl::Status sent = SendMessage(message);
  if (!sent.ok()) {
    EndSend(session, SessionState::kPeerLost, std::string(sent.message()), false);
    return sent;
  }
  absl::MutexLock lock(&mu_);
  ScheduleTickLocked(absl::Now());  // the tick looks at the new deadline
  return session;
}

void TransferConnection::EndSend(const std::shared_ptr<SendSession>& session, SessionState state,
                                 const std::string& message, bool notify_peer) {
  {
    absl::MutexLock lock(&session->mu_);
    if (!session->EndLocked(state, message)) return;
  }
  session->NotifyRoom();
  const bool up = Forget(session->id(), /*sending=*/true);
  // Chunks of an unfinished session still queued (a shaped link holds them for seconds) go now.
  if (up && state != SessionState::kCompleted) link_->DropSession(session->id());
  if (notify_peer && up) {
    v1::TransferFrame cancel;
    cancel.set_session_id(session->id());
    cancel.mutable_cancel()->set_reason(ErrorCodeFor(state));
    cancel.mutable_cancel()->set_message(message);
    SendMessage(cancel).IgnoreError();
  }
  LogEnd("sending", *session, state, message);
}

bool TransferConnection::Forget(uint64_t id, bool sending) {
  absl::MutexLock lock(&mu_);
  if (sending) {
    sending_.erase(id);
  } else {
    receiving_.erase(id);
  }
  NoteRelease();
  return !down_;
}

void TransferConnection::LogEnd(const char* direction, const SessionCore& session,
                                SessionState state, const std::string& message) const {
  if (state == SessionState::kCompleted) {
    spdlog::debug("[{}] {} session {} completed", session.request_id(), direction, session.id());
  } else {
    spdlog::info("[{}] {} session {} on {} ended {}: {}", session.request_id(), direction,
                 session.id(), describe_, SessionStateName(state), message);
  }
}

void TransferConnection::EndReceive(const std::shared_ptr<ReceiveSession>& session,
                                    SessionState state, const std::string& message,
                                    bool notify_peer) {
  std::deque<ReceivedChunk> dropped;  // released outside the lock
  {
    absl::MutexLock lock(&session->mu_);
    if (!session->EndLocked(state, message)) return;
    dropped.swap(session->queue_);
  }
  session->NotifyReady();
  const bool up = Forget(session->id(), /*sending=*/false);
  if (notify_peer && up) {
    v1::TransferFrame reply;
    reply.set_session_id(session->id());
    if (state == SessionState::kCompleted) {
      SessionStats stats = session->stats();
      reply.mutable_ack()->set_chunk_count(stats.chunks);
      reply.mutable_ack()->set_byte_count(stats.bytes);
    } else {
      reply.mutable_error()->set_code(ErrorCodeFor(state));
      reply.mutable_error()->set_message(message);
    }
    SendMessage(reply).IgnoreError();
  }
  LogEnd("receiving", *session, state, message);
}

std::shared_ptr<SendSession> TransferConnection::FindSend(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = sending_.find(id);
  return it == sending_.end() ? nullptr : it->second;
}

std::shared_ptr<ReceiveSession> TransferConnection::FindReceive(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = receiving_.find(id);
  return it == receiving_.end() ? nullptr : it->second;
}

void TransferConnection::OnFrame(Frame frame) {
  if (!EnterCallback(/*touch_liveness=*/true)) return;
  HandleFrame(std::move(frame));
  LeaveCallback();
}

void TransferConnection::HandleFrame(Frame frame) {
  if (frame.type == FrameType::kHeartbeat) return;
  v1::TransferFrame message;
  if (!message.ParseFromString(frame.meta) || FrameTypeOf(message.body_case()) != frame.type ||
      message.session_id() != frame.session_id) {
    spdlog::warn("{}: dropping a malformed {} frame for session {}", describe_,
                 FrameTypeName(frame.type), frame.session_id);
    if (auto session = FindReceive(frame.session_id); session && !IsControl(frame.type)) {
      EndReceive(session, SessionState::kProtocolError,
                 absl::StrCat("malformed ", FrameTypeName(frame.type), " frame"), true);
    }
    return;
  }
  const uint64_t id = message.session_id();
  switch (frame.type) {
    case FrameType::kHeader:
      HandleHeader(id, std::move(*message.mutable_header()));
      break;
    case FrameType::kChunk:
    case FrameType::kTrailer:
      HandleData(id, std::move(message), std::move(frame.payload), frame.payload_crc);
      break;
    default:
      HandleControl(id, message);
      break;
  }
}

void TransferConnection::HandleHeader(uint64_t id, v1::TransferHeader header) {
  auto session = std::make_shared<ReceiveSession>(id, std::move(header), weak_from_this());
  const v1::TransferHeader& h = session->header();
  {
    absl::MutexLock lock(&session->mu_);
    session->stats_.start = absl::Now();
    if (h.deadline_ms() > 0) session->deadline_ = absl::Now() + absl::Milliseconds(h.deadline_ms());
  }
  std::optional<EarlyCancel> cancelled;  // the sender's Cancel overtook this header
  {
    absl::MutexLock lock(&mu_);
    if (down_ || id == 0 || receiving_.count(id) > 0) return;  // a duplicate header is ignored
    last_header_id_ = std::max(last_header_id_, id);
    auto it = cancelled_before_header_.find(id);
    if (it != cancelled_before_header_.end()) {
      cancelled = it->second;
      cancelled_before_header_.erase(it);
    }
    // Ids are taken in order but headers of concurrent sessions may leave slightly out of it;
    // a Cancel far behind the newest header will find no header any more.
    if (last_header_id_ > kEarlyCancelWindow) {
      cancelled_before_header_.erase(
          cancelled_before_header_.begin(),
          cancelled_before_header_.lower_bound(last_header_id_ - kEarlyCancelWindow));
    }
    if (!cancelled.has_value()) {
      receiving_[id] = session;
      ScheduleTickLocked(absl::Now());  // the tick looks at the new deadline
      NoteChange();
    }
  }
  if (cancelled.has_value()) {
    // Handed out ended, so whoever waits for it learns why at once.
    {
      absl::MutexLock lock(&session->mu_);
      session->EndLocked(cancelled->state, cancelled->why);
    }
    LogEnd("receiving", *session, cancelled->state, cancelled->why);
    Offer(session);
    return;
  }
  std::string refusal;
  SessionState state = SessionState::kOpen;
  if (h.protocol_major() != kProtocolMajor) {
    state = SessionState::kVersionMismatch;
    refusal =
        absl::StrCat("sender speaks scd.v1 transfer protocol ", h.protocol_major(), ".",
                     h.protocol_minor(), ", this receiver ", kProtocolMajor, ".", kProtocolMinor);
  } else if (!options_.expected_producer_fingerprint.empty() &&
             h.producer_fingerprint() != options_.expected_producer_fingerprint) {
    state = SessionState::kFingerprintMismatch;
    refusal =
        absl::StrCat("producer fingerprint '", h.producer_fingerprint(),
                     "', this receiver expects '", options_.expected_producer_fingerprint, "'");
  } else if (!options_.expected_consumer_fingerprint.empty() &&
             h.consumer_fingerprint() != options_.expected_consumer_fingerprint) {
    state = SessionState::kFingerprintMismatch;
    refusal = absl::StrCat("codes encoded for consumer fingerprint '", h.consumer_fingerprint(),
                           "', this receiver is '", options_.expected_consumer_fingerprint, "'");
  }
  if (state != SessionState::kOpen) {
    EndReceive(session, state, refusal, true);
    return;
  }
  Offer(session);
}

void TransferConnection::Offer(const std::shared_ptr<ReceiveSession>& session) {
  if (options_.on_session) {
    options_.on_session(session);
  } else {
    absl::MutexLock lock(&mu_);
    accept_queue_.push_back(session);
  }
}

void TransferConnection::HandleData(uint64_t id, v1::TransferFrame message, Payload payload,
                                    std::optional<uint32_t> payload_crc) {
  std::shared_ptr<ReceiveSession> session = FindReceive(id);
  if (session == nullptr) return;  // a session that already ended: drop (releases the payload)
  std::string overflow;
  {
    absl::MutexLock lock(&session->mu_);
    if (session->state_ != SessionState::kOpen) return;
    const size_t bytes = payload.size() + message.chunk().scales().size();
    const uint64_t expected = session->header_.expected_bytes();
    if (message.has_trailer()) {
      session->trailer_ = message.trailer();
    } else if (expected != 0 && session->stats_.bytes + bytes > expected) {
      // More than the header announced: refused as it arrives, not queued until the trailer.
      overflow =
          absl::StrCat("chunk ", session->stats_.chunks, " brings the session to ",
                       session->stats_.bytes + bytes, " bytes; the header announced ", expected);
    } else {
      const absl::Time now = absl::Now();
      if (session->stats_.chunks == 0) session->stats_.first_byte = now;
      session->stats_.last_byte = now;
      session->stats_.bytes += bytes;
      ++session->stats_.chunks;
      session->queue_.push_back(
          {std::move(*message.mutable_chunk()), std::move(payload), payload_crc});
    }
  }
  if (overflow.empty()) return session->NotifyReady();
  EndReceive(session, SessionState::kProtocolError, overflow, true);
}

void TransferConnection::HandleControl(uint64_t id, const v1::TransferFrame& message) {
  switch (message.body_case()) {
    case v1::TransferFrame::kCredit: {
      if (auto session = FindSend(id)) {
        {
          absl::MutexLock lock(&session->mu_);
          session->inflight_ -= std::min<size_t>(session->inflight_, message.credit().bytes());
        }
        session->NotifyRoom();
      }
      break;
    }
    case v1::TransferFrame::kAck: {
      if (auto session = FindSend(id)) {
        SessionStats stats = session->stats();
        const bool match = message.ack().chunk_count() == stats.chunks &&
                           message.ack().byte_count() == stats.bytes;
        EndSend(session, match ? SessionState::kCompleted : SessionState::kProtocolError,
                match ? ""
                      : absl::StrCat("receiver acked ", message.ack().chunk_count(), " chunks / ",
                                     message.ack().byte_count(), " bytes, sent ", stats.chunks,
                                     " / ", stats.bytes),
                !match);
      }
      break;
    }
    case v1::TransferFrame::kError: {
      if (auto session = FindSend(id)) {
        EndSend(session, StateFor(message.error().code()),
                absl::StrCat("receiver: ", message.error().message()), false);
      }
      break;
    }
    case v1::TransferFrame::kCancel: {
      const std::string why = absl::StrCat("sender: ", message.cancel().message());
      if (auto session = FindReceive(id)) {
        EndReceive(session, CancelStateFor(message.cancel().reason()), why, false);
      } else {
        // Control frames may overtake the session's header (still queued behind other data, or
        // dropped with the session's data by DropSession): remember, so a late header is refused.
        // Bounded: only ids near the newest header, a bounded number of them, and a bounded
        // reason, so a peer's Cancels cannot grow this map.
        absl::MutexLock lock(&mu_);
        const bool near =
            id + kEarlyCancelWindow > last_header_id_ && id <= last_header_id_ + kEarlyCancelWindow;
        if (id != 0 && near && cancelled_before_header_.size() < kEarlyCancelWindow) {
          cancelled_before_header_.emplace(id,
                                           EarlyCancel{CancelStateFor(message.cancel().reason()),
                                                       why.substr(0, kMaxReasonBytes)});
        }
      }
      break;
    }
    default:
      break;
  }
}

void TransferConnection::OnLinkDown(absl::Status status) {
  if (!EnterCallback(/*touch_liveness=*/false)) return;
  LinkLost(std::string(status.message()));
  LeaveCallback();
}

void TransferConnection::LinkLost(const std::string& why) {
  std::map<uint64_t, std::shared_ptr<SendSession>> sending;
  std::map<uint64_t, std::shared_ptr<ReceiveSession>> receiving;
  std::deque<std::shared_ptr<ReceiveSession>> unaccepted;
  {
    absl::MutexLock lock(&mu_);
    if (down_) return;
    down_ = true;
    sending.swap(sending_);
    receiving.swap(receiving_);
    unaccepted.swap(accept_queue_);
  }
  if (!sending.empty() || !receiving.empty()) {
    spdlog::warn("{}: link lost ({}); ending {} sessions", describe_, why,
                 sending.size() + receiving.size());
  }
  const std::string message = absl::StrCat("link lost: ", why);
  for (auto& [id, session] : sending) EndSend(session, SessionState::kPeerLost, message, false);
  for (auto& [id, session] : receiving) {
    EndReceive(session, SessionState::kPeerLost, message, false);
  }
  link_->Close();
}

namespace {

// The threads every connection's tick runs on (created at the first connection, never destroyed,
// as Clock::Real()'s timer thread): a tick sends a heartbeat (Link::Send queues it), checks
// liveness and deadlines, and ends what lapsed -- short work, on two threads so that one
// connection's slow end does not hold another's heartbeat back.
WorkQueue& TickQueue() {
  static WorkQueue* const queue = new WorkQueue(2, "scd-xfer-tick");
  return *queue;
}

}  // namespace

void StartConnectionTicks() { TickQueue(); }

void TransferConnection::ScheduleTickLocked(absl::Time when) {
  if (stopping_ || (tick_timer_.armed() && tick_at_ <= when)) return;
  tick_at_ = when;
  tick_timer_ = Clock::Timer(Clock::Real(), when,
                             [weak = std::weak_ptr<TransferConnection>(weak_from_this())] {
                               TickQueue().Run([weak] {
                                 if (std::shared_ptr<TransferConnection> connection = weak.lock())
                                   connection->Tick();
                               });
                             });
}

void TransferConnection::Tick() {
  absl::MutexLock lock(&mu_);
  const absl::Time planned = tick_at_;
  tick_at_ = absl::InfiniteFuture();
  tick_timer_ = Clock::Timer();  // this one fired; the next is armed below
  if (stopping_) return;
  const absl::Time now = absl::Now();
  const absl::Time tick_before = last_tick_;
  last_tick_ = now;
  if (!down_ && now - last_receive_ >= options_.liveness_timeout) {
    const std::string why =
        absl::StrCat("nothing from the peer for ", absl::FormatDuration(now - last_receive_),
                     " (liveness timeout ", absl::FormatDuration(options_.liveness_timeout), "; ",
                     beats_since_receive_, " heartbeats sent meanwhile, this check ran ",
                     absl::FormatDuration(now - planned), " late, the one before ",
                     absl::FormatDuration(now - tick_before), " ago)");
    mu_.Unlock();
    LinkLost(why);  // down from now on: no heartbeat, no liveness check
    mu_.Lock();
  }
  if (!down_ && now >= next_heartbeat_) {
    next_heartbeat_ = now + options_.heartbeat_interval;
    ++beats_since_receive_;
    mu_.Unlock();
    v1::TransferFrame beat;
    beat.mutable_heartbeat()->set_sent_unix_us(absl::ToUnixMicros(now));
    SendMessage(beat).IgnoreError();
    mu_.Lock();
  }
  // Deadlines: collect under this lock, look at each under the session's.
  std::vector<std::shared_ptr<SendSession>> sending;
  std::vector<std::shared_ptr<ReceiveSession>> receiving;
  for (auto& [id, s] : sending_) sending.push_back(s);
  for (auto& [id, s] : receiving_) receiving.push_back(s);
  mu_.Unlock();
  absl::Time next_deadline = absl::InfiniteFuture();
  auto check = [&](SessionCore& s) {
    absl::MutexLock session_lock(&s.mu_);
    if (s.deadline_ <= now) return true;
    next_deadline = std::min(next_deadline, s.deadline_);
    return false;
  };
  for (auto& s : sending) {
    if (check(*s)) EndSend(s, SessionState::kDeadlineExceeded, "session deadline passed", true);
  }
  for (auto& s : receiving) {
    if (check(*s)) {
      EndReceive(s, SessionState::kDeadlineExceeded, "session deadline passed", true);
    }
  }
  mu_.Lock();
  // A down link sends no heartbeats and checks no liveness: only deadlines arm the tick (a
  // heartbeat time never advanced once down armed it for the past, a spinning core).
  absl::Time wake = next_deadline;
  if (!down_) wake = std::min({wake, next_heartbeat_, last_receive_ + options_.liveness_timeout});
  if (wake < absl::InfiniteFuture()) ScheduleTickLocked(wake);
}

absl::StatusOr<std::shared_ptr<ReceiveSession>> TransferConnection::AcceptSession(
    absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]()
                   ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return down_ || !accept_queue_.empty(); };
  if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout)) {
    return absl::DeadlineExceededError(absl::StrCat("no session opened on ", describe_, " within ",
                                                    absl::FormatDuration(timeout)));
  }
  if (accept_queue_.empty()) return absl::UnavailableError(absl::StrCat(describe_, " is down"));
  auto session = std::move(accept_queue_.front());
  accept_queue_.pop_front();
  return session;
}

void TransferConnection::Close() {
  std::vector<std::shared_ptr<SendSession>> sending;
  std::vector<std::shared_ptr<ReceiveSession>> receiving;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, s] : sending_) sending.push_back(s);
    for (auto& [id, s] : receiving_) receiving.push_back(s);
  }
  for (auto& s : sending) EndSend(s, SessionState::kCancelled, "connection closed", true);
  for (auto& s : receiving) EndReceive(s, SessionState::kCancelled, "connection closed", true);
  {
    absl::MutexLock lock(&mu_);
    if (down_) return;
    down_ = true;
    accept_queue_.clear();
  }
  link_->Close();
}

bool TransferConnection::alive() const {
  absl::MutexLock lock(&mu_);
  return !down_;
}

size_t TransferConnection::open_sessions() const {
  absl::MutexLock lock(&mu_);
  return sending_.size() + receiving_.size();
}

}  // namespace scd::transport
