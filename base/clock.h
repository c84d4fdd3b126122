// Clock: the one way time reaches the serving core -- now, timers and timed waits. Code that
// decides anything by time (leases, deadlines, admission waits, pacing, retries, drain waits) takes
// a Clock* and reads nothing else; production passes Clock::Real(), tests a SimulatedClock
// (base/simulated_clock.h) that they advance by hand, so a policy is judged on a clock the test
// controls rather than on how busy the machine is (LevelDB's Env and FoundationDB's simulation
// work so).
//
//   Clock::Timer expiry(clock, clock->Now() + lease, [this] { Expire(); });  // cancelled when
//                                                                           // `expiry` dies
//
// A timer's callback runs once, at its time or later: on the real clock's one timer thread for the
// whole process, on a simulated clock inside Advance. Callbacks must be short (hand heavy work to
// a WorkQueue): every timer of the process shares that thread. Timers due at the same time run in
// the order they were set.
// Thread-safety: every member is thread-safe.
#ifndef SCD_BASE_CLOCK_H_
#define SCD_BASE_CLOCK_H_

#include <cstdint>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace scd {

class Clock {
 public:
  using TimerId = uint64_t;  // 0 is never a timer

  virtual ~Clock() = default;

  // The process's clock: absl::Now(), one timer thread started at the first timer; never
  // destroyed.
  static Clock* Real();

  virtual absl::Time Now() const = 0;

  // Calls `fire` once at `when` or later (at once, from the timer thread, when `when` has passed).
  virtual TimerId At(absl::Time when, std::function<void()> fire) = 0;
  TimerId After(absl::Duration delay, std::function<void()> fire) {
    return At(Now() + delay, std::move(fire));
  }
  // True when the timer will not run. False when it ran or is running; a running callback is
  // waited for, unless Cancel is called from within it (so whoever cancels may free what the
  // callback uses as soon as Cancel returns).
  virtual bool Cancel(TimerId id) = 0;

  // With `mu` held: waits until `cond` holds or this clock reaches `deadline`; returns whether
  // `cond` holds. `mu` is held again on return (a simulated clock may release it meanwhile).
  virtual bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& cond, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) = 0;

  // Blocks the calling thread until this clock reaches `when`.
  void SleepUntil(absl::Time when);
  void SleepFor(absl::Duration d) { SleepUntil(Now() + d); }

  // A timer owned by a scope: cancelled (see Cancel) when destroyed, reset or re-set. Movable.
  class Timer {
   public:
    Timer() = default;
    Timer(Clock* clock, absl::Time when, std::function<void()> fire)
        : clock_(clock), id_(clock->At(when, std::move(fire))) {}
    Timer(Timer&& other) noexcept { *this = std::move(other); }
    Timer& operator=(Timer&& other) noexcept;
    ~Timer() { Reset(); }
    // Cancels the timer (if any); true when it had not run.
    bool Reset();
    bool armed() const { return id_ != 0; }

   private:
    Clock* clock_ = nullptr;
    TimerId id_ = 0;
  };

  // Runs `tick` every `interval` on `clock` (the first one interval after construction; the next
  // one interval after the previous returned) until destroyed: once the destructor returns no
  // tick runs or is running, unless it is called from within a tick.
  class Ticker {
   public:
    Ticker(Clock* clock, absl::Duration interval, std::function<void()> tick);
    ~Ticker();
    Ticker(const Ticker&) = delete;
    Ticker& operator=(const Ticker&) = delete;

   private:
    void Arm() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
    Clock* const clock_;
    const absl::Duration interval_;
    const std::function<void()> tick_;
    absl::Mutex mu_;
    bool stopped_ ABSL_GUARDED_BY(mu_) = false;
    TimerId id_ ABSL_GUARDED_BY(mu_) = 0;
  };
};

}  // namespace scd

#endif  // SCD_BASE_CLOCK_H_
