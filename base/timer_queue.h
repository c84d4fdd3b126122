// TimerQueue: the pending timers of one clock (base/clock.h) in order of time, then of setting,
// and the one that is running. A clock adds and cancels timers here and runs the due ones on its
// own terms: the real clock's timer thread waits for the earliest on the wall clock
// (WaitUntilDue), a simulated clock runs them as a test advances it (RunNext).
// Thread-safety: thread-safe. Callbacks run without the queue's lock, one at a time per queue
// (only one thread runs a queue's timers).
#ifndef SCD_BASE_TIMER_QUEUE_H_
#define SCD_BASE_TIMER_QUEUE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <thread>
#include <unordered_map>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace scd {

class TimerQueue {
 public:
  using TimerId = uint64_t;

  TimerId Add(absl::Time when, std::function<void()> fire);
  // True when the timer was pending (it will not run now). A running timer is waited for unless
  // the caller is the thread running it.
  bool Cancel(TimerId id);

  // Runs the earliest pending timer if it is due at `limit`: first `before(its time)` (under no
  // lock), then its callback. False when none is due.
  bool RunNext(absl::Time limit, const std::function<void(absl::Time)>& before);
  // Blocks until the earliest timer is due on absl::Now().
  void WaitUntilDue();

  absl::Time Earliest() const;  // absl::InfiniteFuture() when none is pending
  size_t pending() const;
  // Blocks until at least `n` timers are pending (tests: another thread parked on the clock).
  void AwaitPending(size_t n) const;

 private:
  mutable absl::Mutex mu_;
  std::map<std::pair<absl::Time, TimerId>, std::function<void()>> by_time_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<TimerId, absl::Time> when_ ABSL_GUARDED_BY(mu_);
  TimerId next_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;  // changes when the earliest may have changed
  TimerId running_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread::id running_thread_ ABSL_GUARDED_BY(mu_);
};

}  // namespace scd

#endif  // SCD_BASE_TIMER_QUEUE_H_
