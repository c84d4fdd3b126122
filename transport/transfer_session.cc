// The two session kinds: a sender's chunks (CRC, credit window) and a receiver's (order and CRC
// checked on the caller's thread, credit returned). The connection that carries them:
// transfer_connection.cc. A session's mu_ and its connection's are never held together.
#include "transport/transfer_session.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/crc32c.h"
#include "base/status_macros.h"
#include "transport/frame_message.h"

namespace scd::transport {
namespace {

// The chunk's CRC-32C: its payload, then its scales. `payload_crc`: the payload's, when the
// backend already took it as the bytes landed.
uint32_t ChunkCrc(const Payload& payload, const std::string& scales,
                  std::optional<uint32_t> payload_crc = std::nullopt) {
  const uint32_t of_payload =
      payload_crc.has_value() ? *payload_crc : Crc32c(payload.data(), payload.size());
  return Crc32c(scales.data(), scales.size(), of_payload);
}

std::string Hex32(uint32_t v) { return absl::StrFormat("0x%08x", v); }

}  // namespace

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
    auto may_send = [this, bytes]()
                        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return RoomLocked(bytes); };
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

void SendSession::Cancel(const std::string& reason) { End(SessionState::kCancelled, reason); }

void SendSession::Abort(const std::string& reason) { End(SessionState::kAborted, reason); }

void SendSession::End(SessionState state, const std::string& reason) {
  std::shared_ptr<TransferConnection> connection = connection_.lock();
  auto self = std::static_pointer_cast<SendSession>(shared_from_this());
  if (connection != nullptr) {
    connection->EndSend(self, state, reason, true);
  } else {
    {
      absl::MutexLock lock(&mu_);
      EndLocked(state, reason);
    }
    NotifyRoom();
  }
}

size_t SendSession::inflight_bytes() const {
  absl::MutexLock lock(&mu_);
  return inflight_;
}

bool SendSession::RoomLocked(size_t bytes) const {
  return state_ != SessionState::kOpen || inflight_ == 0 || inflight_ + bytes <= max_inflight_;
}

bool SendSession::HasRoomFor(size_t bytes) const {
  absl::MutexLock lock(&mu_);
  return RoomLocked(bytes);
}

void SendSession::OnRoomFor(size_t bytes, std::function<void()> ready) {
  std::function<void()> now;
  {
    absl::MutexLock lock(&mu_);
    room_for_ = bytes;
    on_room_.Park(std::move(ready));
    now = on_room_.TakeIf(RoomLocked(room_for_));
  }
  if (now) now();
}

void SendSession::NotifyRoom() {
  std::function<void()> now;
  {
    absl::MutexLock lock(&mu_);
    now = on_room_.TakeIf(RoomLocked(room_for_));
  }
  if (now) now();
}

size_t SendSession::AwaitInflightAtMost(size_t bytes, absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  auto drained = [this, bytes]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return state_ != SessionState::kOpen || inflight_ <= bytes;
  };
  mu_.AwaitWithDeadline(absl::Condition(&drained), deadline);
  return inflight_;
}

// ---- ReceiveSession ----------------------------------------------------------------------------

absl::StatusOr<std::optional<ReceivedChunk>> ReceiveSession::Next(absl::Duration timeout) {
  std::shared_ptr<TransferConnection> connection = connection_.lock();
  auto self = std::static_pointer_cast<ReceiveSession>(shared_from_this());
  ReceivedChunk chunk;
  {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ReadyLocked(); };
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
      } else if (header_.expected_bytes() != 0 &&
                 (header_.adaptive() ? stats_.bytes > header_.expected_bytes()
                                     : header_.expected_bytes() != stats_.bytes)) {
        mismatch = absl::StrCat("header expected ", header_.expected_bytes(), " bytes, received ",
                                stats_.bytes);
      } else if (header_.expected_chunks() != 0 &&
                 (header_.adaptive() ? stats_.chunks < header_.expected_chunks()
                                     : header_.expected_chunks() != stats_.chunks)) {
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
    const uint32_t crc = ChunkCrc(chunk.payload, chunk.meta.scales(), chunk.payload_crc);
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
    {
      absl::MutexLock lock(&mu_);
      EndLocked(SessionState::kCancelled, reason);
      queue_.clear();
    }
    NotifyReady();
  }
}

bool ReceiveSession::ReadyLocked() const {
  return state_ != SessionState::kOpen || !queue_.empty() || trailer_.has_value();
}

void ReceiveSession::OnReady(std::function<void()> ready) {
  std::function<void()> now;
  {
    absl::MutexLock lock(&mu_);
    on_ready_.Park(std::move(ready));
    now = on_ready_.TakeIf(ReadyLocked());
  }
  if (now) now();
}

void ReceiveSession::NotifyReady() {
  std::function<void()> now;
  {
    absl::MutexLock lock(&mu_);
    now = on_ready_.TakeIf(ReadyLocked());
  }
  if (now) now();
}

size_t ReceiveSession::queued_chunks() const {
  absl::MutexLock lock(&mu_);
  return queue_.size();
}

}  // namespace scd::transport
