#include "base/clock.h"

#include <mutex>
#include <thread>

#include "absl/time/clock.h"
#include "base/thread_name.h"
#include "base/timer_queue.h"

namespace scd {
namespace {

// absl::Now() and one timer thread for the process, started with the first timer.
class RealClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }

  TimerId At(absl::Time when, std::function<void()> fire) override {
    std::call_once(started_, [this] {
      std::thread([this] {
        NameThisThread("scd-timers");
        for (;;) {
          queue_.WaitUntilDue();
          while (queue_.RunNext(absl::Now(), nullptr)) {
          }
        }
      }).detach();  // the clock is never destroyed
    });
    return queue_.Add(when, std::move(fire));
  }

  bool Cancel(TimerId id) override { return queue_.Cancel(id); }

  bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& cond, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) override {
    return mu->AwaitWithDeadline(cond, deadline);
  }

 private:
  std::once_flag started_;
  TimerQueue queue_;
};

}  // namespace

Clock* Clock::Real() {
  static Clock* const real = new RealClock();
  return real;
}

void Clock::SleepUntil(absl::Time when) {
  absl::Mutex mu;
  absl::MutexLock lock(&mu);
  static const bool kNever = false;
  AwaitWithDeadline(&mu, absl::Condition(&kNever), when);
}

Clock::Timer& Clock::Timer::operator=(Timer&& other) noexcept {
  if (this != &other) {
    Reset();
    clock_ = other.clock_;
    id_ = other.id_;
    other.id_ = 0;
  }
  return *this;
}

bool Clock::Timer::Reset() {
  if (id_ == 0) return false;
  const TimerId id = id_;
  id_ = 0;
  return clock_->Cancel(id);
}

Clock::Ticker::Ticker(Clock* clock, absl::Duration interval, std::function<void()> tick)
    : clock_(clock), interval_(interval), tick_(std::move(tick)) {
  absl::MutexLock lock(&mu_);
  Arm();
}

Clock::Ticker::~Ticker() {
  TimerId id;
  {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    id = id_;
  }
  clock_->Cancel(id);  // without the lock: a running tick takes it to re-arm (and sees stopped_)
}

void Clock::Ticker::Arm() {
  id_ = clock_->At(clock_->Now() + interval_, [this] {
    tick_();
    absl::MutexLock lock(&mu_);
    if (!stopped_) Arm();
  });
}

}  // namespace scd
