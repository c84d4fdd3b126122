#include "base/timer_queue.h"

#include "absl/time/clock.h"

namespace scd {

TimerQueue::TimerId TimerQueue::Add(absl::Time when, std::function<void()> fire) {
  absl::MutexLock lock(&mu_);
  const TimerId id = next_id_++;
  by_time_.emplace(std::make_pair(when, id), std::move(fire));
  when_.emplace(id, when);
  ++version_;
  return id;
}

bool TimerQueue::Cancel(TimerId id) {
  absl::MutexLock lock(&mu_);
  auto it = when_.find(id);
  if (it != when_.end()) {
    by_time_.erase(std::make_pair(it->second, id));
    when_.erase(it);
    ++version_;
    return true;
  }
  if (running_ == id && running_thread_ != std::this_thread::get_id()) {
    auto finished = [this, id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return running_ != id; };
    mu_.Await(absl::Condition(&finished));
  }
  return false;
}

bool TimerQueue::RunNext(absl::Time limit, const std::function<void(absl::Time)>& before) {
  std::function<void()> fire;
  absl::Time when;
  {
    absl::MutexLock lock(&mu_);
    if (by_time_.empty() || by_time_.begin()->first.first > limit) return false;
    auto first = by_time_.begin();
    when = first->first.first;
    running_ = first->first.second;
    running_thread_ = std::this_thread::get_id();
    fire = std::move(first->second);
    when_.erase(running_);
    by_time_.erase(first);
    ++version_;
  }
  if (before) before(when);
  fire();
  fire = nullptr;  // what the callback captured goes before a Cancel waiting for it returns
  absl::MutexLock lock(&mu_);
  running_ = 0;
  return true;
}

void TimerQueue::WaitUntilDue() {
  absl::MutexLock lock(&mu_);
  for (;;) {
    const absl::Time next =
        by_time_.empty() ? absl::InfiniteFuture() : by_time_.begin()->first.first;
    if (next <= absl::Now()) return;
    const uint64_t seen = version_;
    auto changed = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return version_ != seen; };
    mu_.AwaitWithDeadline(absl::Condition(&changed), next);
  }
}

absl::Time TimerQueue::Earliest() const {
  absl::MutexLock lock(&mu_);
  return by_time_.empty() ? absl::InfiniteFuture() : by_time_.begin()->first.first;
}

size_t TimerQueue::pending() const {
  absl::MutexLock lock(&mu_);
  return by_time_.size();
}

void TimerQueue::AwaitPending(size_t n) const {
  absl::MutexLock lock(&mu_);
  auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return by_time_.size() >= n; };
  mu_.Await(absl::Condition(&enough));
}

}  // namespace scd
