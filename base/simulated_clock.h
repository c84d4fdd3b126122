// SimulatedClock: a Clock (base/clock.h) that stands still until a test advances it. Advance runs
// every timer that falls due on the way, in order, on the advancing thread, with Now() reading
// each timer's own time while it runs; threads blocked in AwaitWithDeadline or SleepUntil wake
// when it passes their deadline. With it a test drives a time-based policy (a lease, a deadline,
// a pacing window) through exactly the instants it names, in microseconds of its own time, on a
// machine however busy.
//
//   SimulatedClock clock;                          // starts at an arbitrary fixed instant
//   Admission admission(&clock, ...);              // the code under test reads only `clock`
//   clock.Advance(absl::Seconds(2));               // the waits whose deadline passed end here
//
// A timer callback must not block on this clock (it runs inside Advance), and Advance must not be
// called holding a mutex that a timed wait on this clock waits with. A test that needs
// another thread parked on the clock before it advances waits for it with AwaitPending -- an
// event, not a sleep.
// Thread-safety: thread-safe; Advance from one thread at a time.
#ifndef SCD_BASE_SIMULATED_CLOCK_H_
#define SCD_BASE_SIMULATED_CLOCK_H_

#include "base/clock.h"
#include "base/timer_queue.h"

namespace scd {

class SimulatedClock final : public Clock {
 public:
  explicit SimulatedClock(absl::Time start = absl::FromUnixSeconds(1'700'000'000));

  absl::Time Now() const override;
  TimerId At(absl::Time when, std::function<void()> fire) override;
  bool Cancel(TimerId id) override;
  bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& cond, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) override;

  // Moves the clock to `when` (never backwards), running the timers due on the way.
  void AdvanceTo(absl::Time when);
  void Advance(absl::Duration d) { AdvanceTo(Now() + d); }
  // Runs the timers already due without moving the clock (one set for Now() by a callback).
  void RunDue() { AdvanceTo(Now()); }

  // Timers and timed waits pending; blocks until at least `n` are.
  size_t pending() const { return timers_.pending(); }
  void AwaitPending(size_t n) const { timers_.AwaitPending(n); }
  // The earliest pending one's time (absl::InfiniteFuture() when none).
  absl::Time next() const { return timers_.Earliest(); }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
  TimerQueue timers_;
};

}  // namespace scd

#endif  // SCD_BASE_SIMULATED_CLOCK_H_
