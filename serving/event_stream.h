// EventStream: the server's side of one streamed GenerateEvent call on gRPC's callback API (a
// ServerWriteReactor), so that an open stream costs a small object and no thread. Events queued
// from any thread are written one at a time, in order; End(status) ends the call once every
// queued event is written. The queue is bounded for the pusher: Push never drops an event
// (nothing is lost) but says when the queue reached its capacity, and a pusher that can wait
// stops until OnRoom (a reactor: it stops reading its source); one whose events are bounded
// anyway (a consumer's request: max_tokens) may go on. A slow client so slows its own stream.
//
// The call's cancellation (base/cancellation.h) is cancelled when gRPC reports the call
// cancelled (the client went away, its deadline passed, the server shuts down: OnCancel, at
// once, no polling) or a write fails; its callbacks give back what the request holds. After
// that, queued and pushed events are dropped and End finishes at once.
//
// Lifetime: gRPC holds the stream until OnDone; whoever else may still touch it (a target's
// reader, a timer, a body thread) takes a Hold and Releases it; the last Release deletes it.
// `ended` runs once, in OnDone, with the status the call ended with (CANCELLED when the client
// went away), before gRPC's hold is released.
// Thread-safety: Push, End, Hold and Release are thread-safe; End is called once.
#ifndef SCD_SERVING_EVENT_STREAM_H_
#define SCD_SERVING_EVENT_STREAM_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstddef>
#include <deque>
#include <functional>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "base/cancellation.h"
#include "scd/v1/inference.pb.h"

namespace scd {

class EventStream : public grpc::ServerWriteReactor<v1::GenerateEvent> {
 public:
  using Ended = std::function<void(const grpc::Status& status)>;

  // `capacity` (>= 1): queued events at which Push reports the stream full. `ended`: may be empty.
  EventStream(size_t capacity, Ended ended);
  EventStream(const EventStream&) = delete;
  EventStream& operator=(const EventStream&) = delete;

  // Queues `event` to be written (dropped once the call is cancelled). Returns false when the
  // queue is at capacity after it: push no more until OnRoom.
  bool Push(v1::GenerateEvent event);
  // Ends the call with `status` once every queued event is written (at once when cancelled).
  void End(grpc::Status status);

  Cancellation& cancellation() { return cancellation_; }
  // True once the call is cancelled (the client gone, a write failed, or Cancel-led by its owner).
  bool cancelled() const { return cancellation_.cancelled(); }

  void Hold();
  void Release();  // the last one deletes the stream

 protected:
  ~EventStream() override;
  // The queue fell below capacity after a Push reported it full (a gRPC thread; no lock held).
  virtual void OnRoom() {}

 private:
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;
  // Starts the next write or the Finish, when one is due (call with no lock held).
  void Advance();

  const size_t capacity_;
  const Ended ended_;
  Cancellation cancellation_;
  Cancellation::Registration wake_;  // drops the queue on cancellation
  std::atomic<int> holds_{1};        // gRPC's, until OnDone
  absl::Mutex mu_;
  std::deque<v1::GenerateEvent> queue_ ABSL_GUARDED_BY(mu_);
  v1::GenerateEvent writing_event_;  // the write under way (valid until OnWriteDone)
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool full_ ABSL_GUARDED_BY(mu_) = false;  // Push reported full; OnRoom owed
  bool gone_ ABSL_GUARDED_BY(mu_) = false;  // the client went away or a write failed
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> end_ ABSL_GUARDED_BY(mu_);
  grpc::Status finished_with_;  // set before Finish, read in OnDone
};

}  // namespace scd

#endif  // SCD_SERVING_EVENT_STREAM_H_
