#include "base/simulated_clock.h"

#include <algorithm>
#include <atomic>
#include <memory>

namespace scd {

SimulatedClock::SimulatedClock(absl::Time start) : now_(start) {}

absl::Time SimulatedClock::Now() const {
  absl::MutexLock lock(&mu_);
  return now_;
}

Clock::TimerId SimulatedClock::At(absl::Time when, std::function<void()> fire) {
  return timers_.Add(when, std::move(fire));
}

bool SimulatedClock::Cancel(TimerId id) { return timers_.Cancel(id); }

bool SimulatedClock::AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& cond,
                                       absl::Time deadline) {
  if (cond.Eval()) return true;
  if (deadline <= Now()) return false;
  // The deadline is a timer that marks the wait expired and wakes it: absl::Mutex re-evaluates
  // a waiter's condition when the mutex is released.
  auto expired = std::make_shared<std::atomic<bool>>(false);
  const TimerId wake = At(deadline, [mu, expired] {
    expired->store(true);
    mu->Lock();
    mu->Unlock();
  });
  struct Wait {
    const absl::Condition* cond;
    const std::atomic<bool>* expired;
  } wait{&cond, expired.get()};
  mu->Await(absl::Condition(
      +[](Wait* w) { return w->expired->load() || w->cond->Eval(); }, &wait));
  // The wake-up may be running on the advancing thread: waiting for `mu`, or still inside its
  // Unlock. Let it finish before this returns (the caller may destroy `mu` then).
  mu->Unlock();
  Cancel(wake);
  mu->Lock();
  return cond.Eval();
}

void SimulatedClock::AdvanceTo(absl::Time when) {
  auto set_now = [this](absl::Time t) {
    absl::MutexLock lock(&mu_);
    now_ = std::max(now_, t);
  };
  while (timers_.RunNext(when, set_now)) {
  }
  set_now(when);
}

}  // namespace scd
