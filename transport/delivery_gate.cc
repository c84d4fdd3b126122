#include "transport/delivery_gate.h"

#include <spdlog/spdlog.h>

#include <utility>

#include "base/exception_guard.h"

namespace scd::transport {

// Marks the calling thread as the one inside a handler call, for the scope.
class DeliveryGate::InHandlerScope {
 public:
  explicit InHandlerScope(DeliveryGate* gate) : gate_(gate) {
    gate_->delivering_.store(std::this_thread::get_id());
  }
  ~InHandlerScope() { gate_->delivering_.store(std::thread::id()); }
  InHandlerScope(const InHandlerScope&) = delete;
  InHandlerScope& operator=(const InHandlerScope&) = delete;

 private:
  DeliveryGate* gate_;
};

void DeliveryGate::Start(LinkHandler* handler) {
  if (handler == nullptr) return;
  absl::MutexLock lock(&mu_);
  if (handler_ == handler) return;  // the same handler again (a backend's two paths to Start)
  if (handler_ != nullptr) {
    spdlog::warn("{}: Start called twice; keeping the first handler", description_);
    return;
  }
  handler_ = handler;
  InHandlerScope scope(this);
  // One at a time: a handler closing the link meanwhile empties held_.
  while (!held_.empty()) {
    Frame frame = std::move(held_.front());
    held_.pop_front();
    CallOnFrameLocked(std::move(frame));
  }
  FlushDownLocked();
}

bool DeliveryGate::started() const {
  absl::MutexLock lock(&mu_);
  return handler_ != nullptr;
}

void DeliveryGate::Deliver(Frame frame) {
  absl::MutexLock lock(&mu_);
  if (down_.has_value()) return;  // nothing after the link's end
  if (handler_ == nullptr) {
    held_.push_back(std::move(frame));
    return;
  }
  InHandlerScope scope(this);
  CallOnFrameLocked(std::move(frame));
  FlushDownLocked();  // the handler may have closed the link
}

// Inside a handler call on this thread the lock is held already (by this same thread, further up
// the stack): record, and the outer call delivers the end when the handler returns.
void DeliveryGate::Down(absl::Status status, bool drop_held) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  if (InHandler()) {
    RecordDownLocked(std::move(status), drop_held);
    return;
  }
  absl::MutexLock lock(&mu_);
  RecordDownLocked(std::move(status), drop_held);
  InHandlerScope scope(this);
  FlushDownLocked();
}

bool DeliveryGate::down() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
  if (InHandler()) return down_.has_value();
  absl::MutexLock lock(&mu_);
  return down_.has_value();
}

void DeliveryGate::RecordDownLocked(absl::Status status, bool drop_held) {
  // A link the peer closed and then closed here too drops what it held: the end it reports
  // stays the first one.
  if (drop_held) held_.clear();
  if (!down_.has_value()) down_ = std::move(status);
}

void DeliveryGate::FlushDownLocked() {
  // Frames the peer sent before it closed reach a handler that starts late, ahead of the end.
  if (!down_.has_value() || down_delivered_ || handler_ == nullptr || !held_.empty()) return;
  down_delivered_ = true;
  LogIfThrew(GuardExceptions("LinkHandler::OnLinkDown", [&] {
    handler_->OnLinkDown(*down_);
    return absl::OkStatus();
  }));
}

void DeliveryGate::CallOnFrameLocked(Frame frame) {
  LogIfThrew(GuardExceptions("LinkHandler::OnFrame", [&] {
    handler_->OnFrame(std::move(frame));
    return absl::OkStatus();
  }));
}

void DeliveryGate::LogIfThrew(const absl::Status& status) const {
  if (!status.ok()) spdlog::error("{}: {}", description_, std::string(status.message()));
}

}  // namespace scd::transport
