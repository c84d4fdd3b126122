#include "serving/event_stream.h"

#include <utility>

namespace scd {

EventStream::EventStream(size_t capacity, Ended ended)
    : capacity_(capacity < 1 ? 1 : capacity), ended_(std::move(ended)) {
  // However the call is cancelled, queued events are dropped and a waiting pusher told.
  wake_ = cancellation_.OnCancel([this](const absl::Status&) {
    bool room = false;
    {
      absl::MutexLock lock(&mu_);
      gone_ = true;
      queue_.clear();
      room = std::exchange(full_, false);
    }
    Advance();  // an End already made finishes now
    if (room) OnRoom();
  });
}

EventStream::~EventStream() { wake_.Reset(); }

void EventStream::Hold() { holds_.fetch_add(1, std::memory_order_relaxed); }

void EventStream::Release() {
  if (holds_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
}

bool EventStream::Push(v1::GenerateEvent event) {
  bool room = true;
  {
    absl::MutexLock lock(&mu_);
    // Nobody reads it: never wait for room.
    if (gone_ || cancellation_.cancelled() || end_.has_value()) return true;
    queue_.push_back(std::move(event));
    if (queue_.size() >= capacity_) {
      full_ = true;
      room = false;
    }
  }
  Advance();
  return room;
}

void EventStream::End(grpc::Status status) {
  {
    absl::MutexLock lock(&mu_);
    if (end_.has_value()) return;
    end_ = std::move(status);
  }
  Advance();
}

void EventStream::Advance() {
  enum { kNothing, kWrite, kFinish } next = kNothing;
  {
    absl::MutexLock lock(&mu_);
    if (writing_ || finishing_) return;
    // Cancelled is gone, even before the cancellation's callback above ran: Cancel marks it
    // first, so a pusher woken by it may End here before that (event_stream_test saw the call
    // end OK after its client had cancelled).
    const bool gone = gone_ || cancellation_.cancelled();
    if (!gone && !queue_.empty()) {
      writing_ = true;
      writing_event_ = std::move(queue_.front());
      queue_.pop_front();
      next = kWrite;
    } else if (end_.has_value()) {
      finishing_ = true;
      finished_with_ =
          gone ? grpc::Status(grpc::StatusCode::CANCELLED, "the client went away") : *end_;
      next = kFinish;
    }
  }
  // Outside the lock: gRPC may run a reaction on this thread.
  if (next == kWrite) StartWrite(&writing_event_);
  if (next == kFinish) Finish(finished_with_);
}

void EventStream::OnWriteDone(bool ok) {
  if (!ok) {
    Hold();  // the cancellation's callbacks may end the call: not deleted before they return
    cancellation_.Cancel(absl::CancelledError("the client went away (a write failed)"));
    Release();
  }
  bool room = false;
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (full_ && (gone_ || queue_.size() < capacity_)) {
      full_ = false;
      room = true;
    }
  }
  Advance();
  if (room) OnRoom();
}

void EventStream::OnCancel() {
  Hold();  // as in OnWriteDone
  cancellation_.Cancel(absl::CancelledError("the client went away"));
  Release();
}

void EventStream::OnDone() {
  if (ended_) ended_(finished_with_);
  Release();
}

}  // namespace scd
