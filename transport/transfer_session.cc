// Locking: a connection's mu_ and a session's mu_ are never held together (collect under one,
// act under the other), and no lock is held while calling into the link, so a backend that
// delivers synchronously cannot deadlock us.
#include "transport/transfer_session.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/crc32c.h"
#include "base/status_macros.h"
#include "transport/frame_message.h"

namespace scd::transport {
namespace {

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
    default:
      return SessionState::kInternal;
  }
}

uint32_t ChunkCrc(const Payload& payload, const std::string& scales) {
  return Crc32c(scales.data(), scales.size(), Crc32c(payload.data(), payload.size()));
}

std::string Hex32(uint32_t v) { return absl::StrFormat("0x%08x", v); }

}  // namespace

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

// ---- SendSession -------------------------------------------------------------------------------

absl::Status SendSession::SendChunk(v1::CodeChunk chunk, Payload payload) {
  std::shared_ptr<TransferConnection> connection = connection_.lock();
  if (connection == nullptr) return absl::UnavailableError("transfer connection is gone");
  const size_t bytes = payload.size() + chunk.scales().size();
  chunk.clear_payload();
  chunk.set_payload_bytes(payload.size());
  chunk.set_crc32c(ChunkCrc(payload, chunk.scales()));  // before the lock: it reads every byte
  v1::TransferFrame message;
  {
    absl::MutexLock lock(&mu_);
    auto may_send = [this, bytes]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return state_ != SessionState::kOpen || inflight_ == 0 || inflight_ + bytes <= max_inflight_;
    };
    mu_.Await(absl::Condition(&may_send));  // the timer ends the session at its deadline
    if (state_ != SessionState::kOpen) return StatusLocked();
    if (finished_) return absl::FailedPreconditionError("SendChunk after Finish");
    chunk.set_index(next_index_++);
    inflight_ += bytes;
    stats_.max_inflight_bytes = std::max(stats_.max_inflight_bytes, inflight_);
    const absl::Time now = absl::Now();
    if (stats_.chunks == 0) stats_.first_byte = now;
    stats_.last_byte = now;
    stats_.bytes += bytes;
    ++stats_.chunks;
  }
  message.set_session_id(id_);
  *message.mutable_chunk() = std::move(chunk);
  absl::Status sent = connection->SendMessage(message, std::move(payload));
  if (!sent.ok()) {
    connection->EndSend(std::static_pointer_cast<SendSession>(shared_from_this()),
                        SessionState::kPeerLost, std::string(sent.message()), false);
  }
  return sent;
}

absl::Status SendSession::Finish() {
  std::shared_ptr<TransferConnection> connection = connection_.lock();
  if (connection == nullptr) return absl::UnavailableError("transfer connection is gone");
  v1::TransferFrame message;
  message.set_session_id(id_);
  {
    absl::MutexLock lock(&mu_);
    if (state_ != SessionState::kOpen) return StatusLocked();
    if (finished_) return absl::FailedPreconditionError("Finish called twice");
    finished_ = true;
    message.mutable_trailer()->set_chunk_count(stats_.chunks);
    message.mutable_trailer()->set_byte_count(stats_.bytes);
  }
  absl::Status sent = connection->SendMessage(message);
  if (!sent.ok()) {
    connection->EndSend(std::static_pointer_cast<SendSession>(shared_from_this()),
                        SessionState::kPeerLost, std::string(sent.message()), false);
  }
  absl::MutexLock lock(&mu_);
  auto ended = [this]()
                   ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return state_ != SessionState::kOpen; };
  mu_.Await(absl::Condition(&ended));  // deadline, liveness and link loss all end it
  return StatusLocked();
}

void SendSession::Cancel(const std::string& reason) {
  std::shared_ptr<TransferConnection> connection = connection_.lock();
  auto self = std::static_pointer_cast<SendSession>(shared_from_this());
  if (connection != nullptr) {
    connection->EndSend(self, SessionState::kCancelled, reason, true);
  } else {
    absl::MutexLock lock(&mu_);
    EndLocked(SessionState::kCancelled, reason);
  }
}

size_t SendSession::inflight_bytes() const {
  absl::MutexLock lock(&mu_);
  return inflight_;
}

// ---- ReceiveSession ----------------------------------------------------------------------------

absl::StatusOr<std::optional<ReceivedChunk>> ReceiveSession::Next(absl::Duration timeout) {
  std::shared_ptr<TransferConnection> connection = connection_.lock();
  auto self = std::static_pointer_cast<ReceiveSession>(shared_from_this());
  ReceivedChunk chunk;
  {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return state_ != SessionState::kOpen || !queue_.empty() || trailer_.has_value();
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout)) {
      return absl::DeadlineExceededError(
          absl::StrCat("no chunk within ", absl::FormatDuration(timeout)));
    }
    if (state_ == SessionState::kCompleted) return std::optional<ReceivedChunk>();
    if (state_ != SessionState::kOpen) return StatusLocked();
    if (queue_.empty()) {
      // The trailer, and every chunk before it consumed: check the counts, then ack.
      std::string mismatch;
      if (trailer_->chunk_count() != stats_.chunks || trailer_->byte_count() != stats_.bytes) {
        mismatch = absl::StrCat("trailer says ", trailer_->chunk_count(), " chunks / ",
                                trailer_->byte_count(), " bytes, received ", stats_.chunks, " / ",
                                stats_.bytes);
      } else if (header_.expected_bytes() != 0 && header_.expected_bytes() != stats_.bytes) {
        mismatch = absl::StrCat("header expected ", header_.expected_bytes(), " bytes, received ",
                                stats_.bytes);
      } else if (header_.expected_chunks() != 0 && header_.expected_chunks() != stats_.chunks) {
        mismatch = absl::StrCat("header expected ", header_.expected_chunks(), " chunks, received ",
                                stats_.chunks);
      }
      mu_.Unlock();
      if (connection != nullptr) {
        connection->EndReceive(
            self, mismatch.empty() ? SessionState::kCompleted : SessionState::kProtocolError,
            mismatch, true);
      }
      mu_.Lock();
      if (state_ == SessionState::kCompleted) return std::optional<ReceivedChunk>();
      return StatusLocked();
    }
    chunk = std::move(queue_.front());
    queue_.pop_front();
  }
  // Checks outside the lock: the CRC reads every byte.
  const size_t bytes = chunk.payload.size() + chunk.meta.scales().size();
  std::string problem;
  SessionState bad = SessionState::kProtocolError;
  if (chunk.meta.index() != next_index_) {
    problem = absl::StrCat("chunk index ", chunk.meta.index(), " where ", next_index_, " was due");
  } else if (chunk.payload.size() != chunk.meta.payload_bytes()) {
    problem = absl::StrCat("chunk ", chunk.meta.index(), " carries ", chunk.payload.size(),
                           " payload bytes, its header says ", chunk.meta.payload_bytes());
  } else {
    const uint32_t crc = ChunkCrc(chunk.payload, chunk.meta.scales());
    if (crc != chunk.meta.crc32c()) {
      bad = SessionState::kCorrupt;
      problem = absl::StrCat("chunk ", chunk.meta.index(), " (layer ", chunk.meta.layer(), ", ",
                             chunk.meta.payload_bytes(), " bytes): CRC-32C ", Hex32(crc),
                             ", sender's ", Hex32(chunk.meta.crc32c()));
    }
  }
  if (!problem.empty()) {
    chunk.payload.Reset();
    if (connection != nullptr) connection->EndReceive(self, bad, problem, true);
    return status();
  }
  ++next_index_;
  if (connection != nullptr) {
    v1::TransferFrame credit;
    credit.set_session_id(id_);
    credit.mutable_credit()->set_bytes(bytes);
    connection->SendMessage(credit).IgnoreError();  // a lost link ends us
  }
  return std::optional<ReceivedChunk>(std::move(chunk));
}

void ReceiveSession::Cancel(const std::string& reason) {
  std::shared_ptr<TransferConnection> connection = connection_.lock();
  auto self = std::static_pointer_cast<ReceiveSession>(shared_from_this());
  if (connection != nullptr) {
    connection->EndReceive(self, SessionState::kCancelled, reason, true);
  } else {
    absl::MutexLock lock(&mu_);
    EndLocked(SessionState::kCancelled, reason);
    queue_.clear();
  }
}

size_t ReceiveSession::queued_chunks() const {
  absl::MutexLock lock(&mu_);
  return queue_.size();
}

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
  connection->timer_ = std::thread([c = connection.get()] { c->TimerLoop(); });
  return connection;
}

TransferConnection::~TransferConnection() {
  Close();
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (timer_.joinable()) timer_.join();
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
  if (touch_liveness) last_receive_ = absl::Now();
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
  deadline_changed_ = true;  // wakes the timer to look at the new deadline
  return session;
}

void TransferConnection::EndSend(const std::shared_ptr<SendSession>& session, SessionState state,
                                 const std::string& message, bool notify_peer) {
  {
    absl::MutexLock lock(&session->mu_);
    if (!session->EndLocked(state, message)) return;
  }
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
      HandleData(id, std::move(message), std::move(frame.payload));
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
  {
    absl::MutexLock lock(&mu_);
    if (down_ || receiving_.count(id) > 0) return;  // a duplicate header is ignored
    receiving_[id] = session;
    deadline_changed_ = true;
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
  if (options_.on_session) {
    options_.on_session(session);
  } else {
    absl::MutexLock lock(&mu_);
    accept_queue_.push_back(session);
  }
}

void TransferConnection::HandleData(uint64_t id, v1::TransferFrame message, Payload payload) {
  std::shared_ptr<ReceiveSession> session = FindReceive(id);
  if (session == nullptr) return;  // a session that already ended: drop (releases the payload)
  absl::MutexLock lock(&session->mu_);
  if (session->state_ != SessionState::kOpen) return;
  if (message.has_trailer()) {
    session->trailer_ = message.trailer();
    return;
  }
  const size_t bytes = payload.size() + message.chunk().scales().size();
  const absl::Time now = absl::Now();
  if (session->stats_.chunks == 0) session->stats_.first_byte = now;
  session->stats_.last_byte = now;
  session->stats_.bytes += bytes;
  ++session->stats_.chunks;
  session->queue_.push_back({std::move(*message.mutable_chunk()), std::move(payload)});
}

void TransferConnection::HandleControl(uint64_t id, const v1::TransferFrame& message) {
  switch (message.body_case()) {
    case v1::TransferFrame::kCredit: {
      if (auto session = FindSend(id)) {
        absl::MutexLock lock(&session->mu_);
        session->inflight_ -= std::min<size_t>(session->inflight_, message.credit().bytes());
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
      if (auto session = FindReceive(id)) {
        EndReceive(session,
                   message.cancel().reason() == v1::ERROR_DEADLINE_EXCEEDED
                       ? SessionState::kDeadlineExceeded
                       : SessionState::kCancelled,
                   absl::StrCat("sender: ", message.cancel().message()), false);
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

void TransferConnection::TimerLoop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    const absl::Time now = absl::Now();
    if (!down_ && now - last_receive_ >= options_.liveness_timeout) {
      const std::string why =
          absl::StrCat("nothing from the peer for ", absl::FormatDuration(now - last_receive_),
                       " (liveness timeout ", absl::FormatDuration(options_.liveness_timeout), ")");
      mu_.Unlock();
      LinkLost(why);
      mu_.Lock();
      continue;
    }
    if (!down_ && now >= next_heartbeat_) {
      next_heartbeat_ = now + options_.heartbeat_interval;
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
      if (check(*s)) {
        EndSend(s, SessionState::kDeadlineExceeded, "session deadline passed", true);
      }
    }
    for (auto& s : receiving) {
      if (check(*s)) {
        EndReceive(s, SessionState::kDeadlineExceeded, "session deadline passed", true);
      }
    }
    mu_.Lock();
    // A down link sends no heartbeats and checks no liveness: only deadlines wake the timer (a
    // heartbeat time never advanced once down made the wait return at once, a spinning core).
    absl::Time wake = next_deadline;
    if (!down_) {
      wake = std::min({wake, next_heartbeat_, last_receive_ + options_.liveness_timeout});
    }
    deadline_changed_ = false;
    auto woken = [this]()
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || deadline_changed_; };
    mu_.AwaitWithDeadline(absl::Condition(&woken), wake);
  }
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

// ---- SessionAcceptor ---------------------------------------------------------------------------

struct SessionAcceptor::ReadyQueue {
  absl::Mutex mu;
  bool closed ABSL_GUARDED_BY(mu) = false;
  std::deque<std::shared_ptr<ReceiveSession>> sessions ABSL_GUARDED_BY(mu);
};

SessionAcceptor::SessionAcceptor(std::unique_ptr<Listener> listener, ConnectionOptions options)
    : listener_(std::move(listener)),
      options_(std::move(options)),
      ready_(std::make_shared<ReadyQueue>()) {
  accept_thread_ = std::thread([this] { AcceptLoop(); });
}

SessionAcceptor::~SessionAcceptor() { Close(); }

void SessionAcceptor::AcceptLoop() {
  for (;;) {
    {
      absl::MutexLock lock(&ready_->mu);
      if (ready_->closed) return;
    }
    absl::StatusOr<std::unique_ptr<Link>> link = listener_->Accept(absl::Milliseconds(100));
    if (!link.ok()) {
      if (absl::IsDeadlineExceeded(link.status())) continue;
      if (!absl::IsCancelled(link.status())) {
        spdlog::warn("accepting on {} failed: {}", listener_->address(), link.status().ToString());
      }
      absl::MutexLock lock(&ready_->mu);
      if (ready_->closed || absl::IsCancelled(link.status())) return;
      continue;
    }
    ConnectionOptions options = options_;
    std::weak_ptr<ReadyQueue> queue = ready_;
    options.on_session = [queue](std::shared_ptr<ReceiveSession> session) {
      if (auto q = queue.lock()) {
        absl::MutexLock lock(&q->mu);
        if (!q->closed) q->sessions.push_back(std::move(session));
      }
    };
    auto connection = TransferConnection::Create(*std::move(link), std::move(options));
    absl::MutexLock lock(&mu_);
    // Forget connections whose links are gone (their sessions have ended).
    connections_.erase(std::remove_if(connections_.begin(), connections_.end(),
                                      [](const auto& c) { return !c->alive(); }),
                       connections_.end());
    connections_.push_back(std::move(connection));
  }
}

absl::StatusOr<std::shared_ptr<ReceiveSession>> SessionAcceptor::Accept(absl::Duration timeout) {
  absl::MutexLock lock(&ready_->mu);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ready_->mu) {
    return ready_->closed || !ready_->sessions.empty();
  };
  if (!ready_->mu.AwaitWithTimeout(absl::Condition(&ready), timeout)) {
    return absl::DeadlineExceededError(absl::StrCat("no session on ", listener_->address(),
                                                    " within ", absl::FormatDuration(timeout)));
  }
  if (ready_->closed) return absl::CancelledError("session acceptor closed");
  auto session = std::move(ready_->sessions.front());
  ready_->sessions.pop_front();
  return session;
}

void SessionAcceptor::Close() {
  {
    absl::MutexLock lock(&ready_->mu);
    if (ready_->closed && !accept_thread_.joinable()) return;
    ready_->closed = true;
    ready_->sessions.clear();
  }
  listener_->Close();
  if (accept_thread_.joinable()) accept_thread_.join();
  std::vector<std::shared_ptr<TransferConnection>> connections;
  {
    absl::MutexLock lock(&mu_);
    connections.swap(connections_);
  }
  connections.clear();  // each destructor ends its sessions and joins its threads
}

size_t SessionAcceptor::connections() const {
  absl::MutexLock lock(&mu_);
  return connections_.size();
}

size_t SessionAcceptor::open_sessions() const {
  absl::MutexLock lock(&mu_);
  size_t open = 0;
  for (const auto& connection : connections_) open += connection->open_sessions();
  return open;
}

}  // namespace scd::transport
