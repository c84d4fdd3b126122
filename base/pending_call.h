// PendingCall: one callback parked until its owner's condition holds -- the "tell me when" of an
// object that holds no thread for whoever waits on it (ReceiveSession::OnReady: a chunk is there;
// SendSession::OnRoomFor: credit made room; ByteGauge::OnAtMost: the bytes drained). The owner
// keeps it beside the state it guards, under its own mutex, and calls what TakeIf returns after
// unlocking (the callback may take that mutex again):
//
//   void OnReady(std::function<void()> ready) {        // the waiter
//     std::function<void()> now;
//     { absl::MutexLock l(&mu_); pending_.Park(std::move(ready)); now = pending_.TakeIf(Ready()); }
//     if (now) now();
//   }
//   void Changed() {                                   // after every change of the state
//     std::function<void()> now;
//     { absl::MutexLock l(&mu_); now = pending_.TakeIf(Ready()); }
//     if (now) now();
//   }
//
// Thread-safety: none of its own: the owner's mutex guards it.
#ifndef SCD_BASE_PENDING_CALL_H_
#define SCD_BASE_PENDING_CALL_H_

#include <functional>
#include <utility>

namespace scd {

class PendingCall {
 public:
  // Parks `call`, replacing one parked before.
  void Park(std::function<void()> call) { call_ = std::move(call); }
  // The parked call when `holds` (then no longer parked); else empty.
  std::function<void()> TakeIf(bool holds) {
    if (!holds || !call_) return nullptr;
    return std::exchange(call_, nullptr);
  }
  bool parked() const { return static_cast<bool>(call_); }

 private:
  std::function<void()> call_;
};

}  // namespace scd

#endif  // SCD_BASE_PENDING_CALL_H_
