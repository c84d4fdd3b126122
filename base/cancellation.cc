#include "base/cancellation.h"

#include <utility>
#include <vector>

namespace scd {

Cancellation::Registration::Registration(Registration&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)), id_(std::exchange(other.id_, 0)) {}

Cancellation::Registration& Cancellation::Registration::operator=(Registration&& other) noexcept {
  if (this != &other) {
    Reset();
    owner_ = std::exchange(other.owner_, nullptr);
    id_ = std::exchange(other.id_, 0);
  }
  return *this;
}

void Cancellation::Registration::Reset() {
  if (owner_ != nullptr) owner_->Unregister(id_);
  owner_ = nullptr;
  id_ = 0;
}

bool Cancellation::Cancel(absl::Status why) {
  if (why.ok()) why = absl::CancelledError("cancelled");
  std::vector<std::pair<uint64_t, Callback>> callbacks;
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_locked_) return false;
    cancelled_locked_ = true;
    why_ = why;
    cancelled_.store(true, std::memory_order_release);
    callbacks.assign(callbacks_.begin(), callbacks_.end());
  }
  for (auto& [id, callback] : callbacks) {
    {
      absl::MutexLock lock(&mu_);
      if (callbacks_.erase(id) == 0) continue;  // unregistered meanwhile
      running_ = id;
      running_thread_ = std::this_thread::get_id();
    }
    callback(why);
    absl::MutexLock lock(&mu_);
    running_ = 0;
  }
  return true;
}

absl::Status Cancellation::status() const {
  absl::MutexLock lock(&mu_);
  return why_;
}

Cancellation::Registration Cancellation::OnCancel(Callback callback) {
  absl::Status why;
  {
    absl::MutexLock lock(&mu_);
    if (!cancelled_locked_) {
      const uint64_t id = next_id_++;
      callbacks_.emplace(id, std::move(callback));
      return Registration(this, id);
    }
    why = why_;
  }
  callback(why);
  return Registration();
}

void Cancellation::Unregister(uint64_t id) {
  absl::MutexLock lock(&mu_);
  callbacks_.erase(id);
  if (running_ != id || running_thread_ == std::this_thread::get_id()) return;
  auto done = [this, id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return running_ != id; };
  mu_.Await(absl::Condition(&done));
}

bool Cancellation::WaitUntil(absl::Time deadline, Clock* clock) const {
  absl::MutexLock lock(&mu_);
  return clock->AwaitWithDeadline(&mu_, absl::Condition(&cancelled_locked_), deadline);
}

}  // namespace scd
