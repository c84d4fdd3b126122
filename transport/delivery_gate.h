// DeliveryGate: how every backend hands arriving frames and the link's end to a LinkHandler, so
// each gets the Link contract's delivery rules the same way:
//   - frames that arrive before Link::Start are held and delivered, in order, when it is called;
//   - the handler hears OnLinkDown exactly once, and no OnFrame after it;
//   - a link closed here drops what it held for Start; a link the peer closed delivers what came
//     before the close first;
//   - a handler may close its own link from inside a call: the OnLinkDown comes after that call
//     returns, on the same thread;
//   - nothing a handler throws escapes into the backend's thread (it is logged).
// Handler calls are serialized (a mutex is held across each), so a backend may deliver from any
// thread; the handler sees one call at a time per link.
// Thread-safety: thread-safe.
#ifndef SCD_TRANSPORT_DELIVERY_GATE_H_
#define SCD_TRANSPORT_DELIVERY_GATE_H_

#include <atomic>
#include <deque>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "transport/transport.h"

namespace scd::transport {

class DeliveryGate {
 public:
  explicit DeliveryGate(std::string description) : description_(std::move(description)) {}
  DeliveryGate(const DeliveryGate&) = delete;
  DeliveryGate& operator=(const DeliveryGate&) = delete;

  // Sets the handler (once; a second call with another handler is logged and ignored, with the
  // same one it does nothing), delivers the held frames and then the link's end if it came
  // meanwhile.
  void Start(LinkHandler* handler);
  bool started() const;
  // One arriving frame: to the handler now, or held until Start; dropped once the link is down.
  void Deliver(Frame frame);
  // The link is down because of `status`: the handler's one OnLinkDown (now, at Start, or after
  // the handler call running on this thread returns). `drop_held`: frames held for Start go too,
  // also when the link was down already (a peer's close, then a Close here); the first status is
  // the one reported.
  void Down(absl::Status status, bool drop_held);
  bool down() const;
  // True on the thread inside a handler call of this gate.
  bool InHandler() const { return delivering_.load() == std::this_thread::get_id(); }
  const std::string& description() const { return description_; }

 private:
  class InHandlerScope;
  void CallOnFrameLocked(Frame frame) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FlushDownLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecordDownLocked(absl::Status status, bool drop_held) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LogIfThrew(const absl::Status& status) const;  // what GuardExceptions made of a throw

  const std::string description_;
  mutable absl::Mutex mu_;  // held across handler calls
  LinkHandler* handler_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::deque<Frame> held_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> down_ ABSL_GUARDED_BY(mu_);
  bool down_delivered_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<std::thread::id> delivering_{};
};

}  // namespace scd::transport

#endif  // SCD_TRANSPORT_DELIVERY_GATE_H_
