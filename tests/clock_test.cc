// The real clock: timers fire on its one thread no earlier than their time and in order; Cancel
// waits for a running callback (so its captures may be freed after), except from within it.
#include "base/clock.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

namespace scd {
namespace {

TEST(ClockTest, TimersFireNoEarlierThanTheirTimeAndInOrder) {
  Clock* clock = Clock::Real();
  absl::Mutex mu;
  std::vector<int> order;
  std::vector<absl::Duration> late;  // how long after its time each fired (never negative)
  absl::Notification all;
  const absl::Time t0 = clock->Now();
  for (int ms : {30, 10, 20}) {
    const absl::Time when = t0 + absl::Milliseconds(ms);
    clock->At(when, [&, ms, when] {
      absl::MutexLock lock(&mu);
      order.push_back(ms);
      late.push_back(absl::Now() - when);
      if (order.size() == 3) all.Notify();
    });
  }
  all.WaitForNotification();
  absl::MutexLock lock(&mu);
  EXPECT_EQ(order, (std::vector<int>{10, 20, 30}));
  for (absl::Duration d : late) EXPECT_GE(d, absl::ZeroDuration());
}

TEST(ClockTest, CancelWaitsForARunningCallback) {
  Clock* clock = Clock::Real();
  absl::Notification started, release;
  std::atomic<bool> finished{false};
  const Clock::TimerId id = clock->After(absl::ZeroDuration(), [&] {
    started.Notify();
    release.WaitForNotification();
    finished = true;
  });
  started.WaitForNotification();
  std::atomic<bool> finished_when_cancel_returned{false};
  bool cancelled = true;
  std::thread canceller([&] {
    cancelled = clock->Cancel(id);
    finished_when_cancel_returned = finished.load();
  });
  release.Notify();
  canceller.join();
  EXPECT_FALSE(cancelled);  // it ran
  EXPECT_TRUE(finished_when_cancel_returned.load());
}

TEST(ClockTest, CancelFromWithinTheCallbackAndBeforeIt) {
  Clock* clock = Clock::Real();
  absl::Notification done;
  Clock::TimerId self = 0;
  absl::Mutex mu;
  bool cancelled_self = true;
  {
    absl::MutexLock lock(&mu);
    self = clock->After(absl::ZeroDuration(), [&] {
      absl::MutexLock lock(&mu);
      cancelled_self = clock->Cancel(self);  // does not wait for itself
      done.Notify();
    });
  }
  done.WaitForNotification();
  absl::MutexLock lock(&mu);
  EXPECT_FALSE(cancelled_self);
  std::atomic<bool> fired{false};
  const Clock::TimerId later = clock->After(absl::Hours(1), [&] { fired = true; });
  EXPECT_TRUE(clock->Cancel(later));
  EXPECT_FALSE(fired.load());
}

TEST(ClockTest, AwaitAndSleepReachTheirDeadline) {
  Clock* clock = Clock::Real();
  absl::Mutex mu;
  bool never = false;
  const absl::Time deadline = clock->Now() + absl::Milliseconds(20);
  {
    absl::MutexLock lock(&mu);
    EXPECT_FALSE(clock->AwaitWithDeadline(&mu, absl::Condition(&never), deadline));
  }
  EXPECT_GE(clock->Now(), deadline);
  const absl::Time before = clock->Now();
  // paces: the real clock's SleepFor is the code under test
  clock->SleepFor(absl::Milliseconds(10));
  EXPECT_GE(clock->Now() - before, absl::Milliseconds(10));
}

}  // namespace
}  // namespace scd
