// base/cancellation.h: every callback registered before Cancel runs exactly once with why, one
// registered after runs at once, an unregistered one never runs, unregistering waits for a running
// callback on another thread (and not for its own), and a waiter is woken by Cancel, not by time.
#include "base/cancellation.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "base/simulated_clock.h"

namespace scd {
namespace {

TEST(CancellationTest, CallbacksRunOnceWithWhyAndLateOnesAtOnce) {
  Cancellation cancel;
  EXPECT_FALSE(cancel.cancelled());
  EXPECT_TRUE(cancel.status().ok());
  int runs = 0;
  absl::Status seen;
  Cancellation::Registration r = cancel.OnCancel([&](const absl::Status& why) {
    ++runs;
    seen = why;
    EXPECT_TRUE(cancel.cancelled());  // visible inside the callback
  });
  EXPECT_EQ(runs, 0);
  EXPECT_TRUE(cancel.Cancel(absl::DeadlineExceededError("the deadline passed")));
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(seen.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(cancel.Cancel(absl::CancelledError("again")));  // the first wins
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(cancel.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(*cancel.flag());
  int late = 0;
  Cancellation::Registration l = cancel.OnCancel([&](const absl::Status& why) {
    ++late;
    EXPECT_EQ(why.code(), absl::StatusCode::kDeadlineExceeded);
  });
  EXPECT_EQ(late, 1);
}

TEST(CancellationTest, AnUnregisteredCallbackNeverRuns) {
  Cancellation cancel;
  int runs = 0;
  {
    Cancellation::Registration r = cancel.OnCancel([&](const absl::Status&) { ++runs; });
  }
  Cancellation::Registration kept = cancel.OnCancel([&](const absl::Status&) { runs += 10; });
  Cancellation::Registration moved = std::move(kept);  // the move carries the registration
  kept.Reset();                                        // a moved-from one holds nothing
  cancel.Cancel(absl::Status());
  EXPECT_EQ(runs, 10);
  EXPECT_EQ(cancel.status().code(), absl::StatusCode::kCancelled);  // OK reads as CANCELLED
}

TEST(CancellationTest, UnregisteringWaitsForTheRunningCallbackButNotItsOwn) {
  Cancellation cancel;
  absl::Notification entered, release;
  std::atomic<bool> finished{false};
  Cancellation::Registration slow = cancel.OnCancel([&](const absl::Status&) {
    entered.Notify();
    release.WaitForNotification();
    finished = true;
  });
  Cancellation::Registration self;
  self = cancel.OnCancel([&](const absl::Status&) { self.Reset(); });  // unregisters itself
  std::thread canceller([&] { cancel.Cancel(absl::CancelledError("gone")); });
  entered.WaitForNotification();
  std::thread unregister([&] {
    slow.Reset();  // must not return while the callback runs
    EXPECT_TRUE(finished.load());
  });
  // No event says that `unregister` is blocked in Reset (that is the point): this sleep gives a
  // wrong Reset the time to return early, and the check below would see it.
  // waits: see above: no event says `unregister` is blocked in Reset
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(finished.load());
  release.Notify();
  unregister.join();
  canceller.join();
}

TEST(CancellationTest, AWaiterIsWokenByCancelNotByTime) {
  SimulatedClock clock;
  Cancellation cancel;
  // Not cancelled: the wait ends when the clock reaches its deadline.
  std::atomic<bool> timed_out{false};
  std::thread waiter([&] {
    EXPECT_FALSE(cancel.WaitUntil(clock.Now() + absl::Milliseconds(10), &clock));
    timed_out = true;
  });
  clock.AwaitPending(1);
  clock.Advance(absl::Milliseconds(9));
  EXPECT_FALSE(timed_out.load());
  clock.Advance(absl::Milliseconds(1));
  waiter.join();
  // Cancelled during the wait: woken at once, the clock standing still.
  const absl::Time before = clock.Now();
  std::thread woken(
      [&] { EXPECT_TRUE(cancel.WaitUntil(clock.Now() + absl::Seconds(60), &clock)); });
  clock.AwaitPending(1);
  cancel.Cancel(absl::UnavailableError("peer lost"));
  woken.join();
  EXPECT_EQ(clock.Now(), before);
  EXPECT_EQ(clock.pending(), 0u);
}

// Registrations racing with Cancel: each callback runs at most once, and exactly once when it was
// registered before Cancel and never unregistered.
TEST(CancellationTest, RacesRunEachCallbackAtMostOnce) {
  for (int round = 0; round < 20; ++round) {
    Cancellation cancel;
    constexpr int kThreads = 4, kEach = 200;
    std::vector<std::atomic<int>> runs(kThreads * kEach);
    std::vector<std::atomic<bool>> kept(kThreads * kEach);
    std::vector<Cancellation::Registration> held(kThreads * kEach);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int i = t * kEach; i < (t + 1) * kEach; ++i) {
          held[i] = cancel.OnCancel([&runs, i](const absl::Status&) { ++runs[i]; });
          if (i % 3 == 0) {
            held[i].Reset();
          } else {
            kept[i] = true;
          }
        }
      });
    }
    std::thread canceller([&] { cancel.Cancel(absl::CancelledError("race")); });
    for (auto& t : threads) t.join();
    canceller.join();
    for (int i = 0; i < kThreads * kEach; ++i) {
      ASSERT_LE(runs[i].load(), 1) << i;
      if (kept[i]) {
        ASSERT_EQ(runs[i].load(), 1) << i;
      }
    }
  }
}

}  // namespace
}  // namespace scd
