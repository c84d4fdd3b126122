// SimulatedClock: timers run in order of time then of setting, each seeing its own time; waits
// end exactly when the clock passes their deadline, or earlier when their condition holds.
#include "base/simulated_clock.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace scd {
namespace {

TEST(SimulatedClockTest, TimersRunInOrderAtTheirOwnTime) {
  SimulatedClock clock;
  const absl::Time t0 = clock.Now();
  std::vector<std::pair<int, absl::Duration>> ran;
  auto note = [&](int tag) { return [&, tag] { ran.emplace_back(tag, clock.Now() - t0); }; };
  clock.At(t0 + absl::Seconds(3), note(3));
  clock.At(t0 + absl::Seconds(1), note(1));
  clock.At(t0 + absl::Seconds(2), note(20));
  clock.At(t0 + absl::Seconds(2), note(21));  // same time: in the order set
  clock.At(t0 + absl::Seconds(9), note(9));
  EXPECT_TRUE(ran.empty());
  EXPECT_EQ(clock.next(), t0 + absl::Seconds(1));
  clock.Advance(absl::Seconds(5));
  const std::vector<std::pair<int, absl::Duration>> want = {
      {1, absl::Seconds(1)}, {20, absl::Seconds(2)}, {21, absl::Seconds(2)}, {3, absl::Seconds(3)}};
  EXPECT_EQ(ran, want);
  EXPECT_EQ(clock.Now() - t0, absl::Seconds(5));
  EXPECT_EQ(clock.pending(), 1u);
}

TEST(SimulatedClockTest, CancelAndTimersSetByTimers) {
  SimulatedClock clock;
  int fired = 0;
  const Clock::TimerId gone = clock.After(absl::Seconds(1), [&] { fired += 100; });
  // A callback that sets another timer within the same advance: it runs in that advance.
  clock.After(absl::Seconds(1), [&] { clock.After(absl::Seconds(1), [&] { ++fired; }); });
  EXPECT_TRUE(clock.Cancel(gone));
  EXPECT_FALSE(clock.Cancel(gone));
  clock.Advance(absl::Seconds(2));
  EXPECT_EQ(fired, 1);
  // A timer set for a time already passed runs at the next advance (RunDue), not at once.
  clock.At(clock.Now() - absl::Seconds(1), [&] { fired = -1; });
  EXPECT_EQ(fired, 1);
  clock.RunDue();
  EXPECT_EQ(fired, -1);
}

TEST(SimulatedClockTest, ScopedTimerCancelsWhenDestroyed) {
  SimulatedClock clock;
  int fired = 0;
  {
    Clock::Timer t(&clock, clock.Now() + absl::Seconds(1), [&] { ++fired; });
    EXPECT_TRUE(t.armed());
    Clock::Timer moved = std::move(t);
    EXPECT_FALSE(t.armed());  // NOLINT(bugprone-use-after-move): moved-from is disarmed
    EXPECT_TRUE(moved.armed());
  }
  Clock::Timer kept(&clock, clock.Now() + absl::Seconds(1), [&] { fired += 10; });
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(fired, 10);
  EXPECT_FALSE(kept.Reset());  // it ran
}

TEST(SimulatedClockTest, AwaitEndsAtTheDeadlineOnThisClock) {
  SimulatedClock clock;
  absl::Mutex mu;
  bool ready = false;
  std::atomic<bool> returned{false};
  bool result = true;
  const absl::Time deadline = clock.Now() + absl::Seconds(5);
  std::thread waiter([&] {
    absl::MutexLock lock(&mu);
    result = clock.AwaitWithDeadline(&mu, absl::Condition(&ready), deadline);
    returned = true;
  });
  clock.AwaitPending(1);  // the waiter is parked on the clock
  clock.Advance(absl::Seconds(4));
  EXPECT_FALSE(returned.load());  // nothing wakes it before its deadline
  EXPECT_EQ(clock.pending(), 1u);
  clock.Advance(absl::Seconds(1));
  waiter.join();
  EXPECT_FALSE(result);
  EXPECT_EQ(clock.pending(), 0u);
}

TEST(SimulatedClockTest, AwaitEndsWhenTheConditionHolds) {
  SimulatedClock clock;
  absl::Mutex mu;
  bool ready = false;
  bool result = false;
  std::thread waiter([&] {
    absl::MutexLock lock(&mu);
    result = clock.AwaitWithDeadline(&mu, absl::Condition(&ready), clock.Now() + absl::Hours(1));
  });
  clock.AwaitPending(1);
  {
    absl::MutexLock lock(&mu);
    ready = true;
  }
  waiter.join();
  EXPECT_TRUE(result);
  EXPECT_EQ(clock.pending(), 0u);  // its deadline's timer is gone
  // A deadline already passed: at once, without a timer.
  absl::MutexLock lock(&mu);
  ready = false;
  EXPECT_FALSE(clock.AwaitWithDeadline(&mu, absl::Condition(&ready), clock.Now()));
  EXPECT_EQ(clock.pending(), 0u);
}

TEST(SimulatedClockTest, SleepEndsWhenTheClockGetsThere) {
  SimulatedClock clock;
  const absl::Time t0 = clock.Now();
  absl::Time woke;
  std::thread sleeper([&] {
    // paces: a simulated clock's SleepFor (no real time passes; the code under test)
    clock.SleepFor(absl::Milliseconds(250));
    woke = clock.Now();
  });
  clock.AwaitPending(1);
  clock.Advance(absl::Seconds(1));
  sleeper.join();
  EXPECT_GE(woke - t0, absl::Milliseconds(250));
}

TEST(SimulatedClockTest, TickerTicksEveryIntervalUntilDestroyed) {
  SimulatedClock clock;
  const absl::Time t0 = clock.Now();
  std::vector<absl::Duration> ticks;
  {
    Clock::Ticker ticker(&clock, absl::Milliseconds(100),
                         [&] { ticks.push_back(clock.Now() - t0); });
    clock.Advance(absl::Milliseconds(350));
    EXPECT_EQ(ticks, (std::vector<absl::Duration>{absl::Milliseconds(100), absl::Milliseconds(200),
                                                  absl::Milliseconds(300)}));
    EXPECT_EQ(clock.pending(), 1u);
  }
  EXPECT_EQ(clock.pending(), 0u);
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(ticks.size(), 3u);
}

}  // namespace
}  // namespace scd
