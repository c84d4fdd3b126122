// base/change_notice: a wait ends at the first change after the count it names (at once when one
// came already), at its deadline on the clock it is given (a simulated one here, so the test does
// not depend on how busy the machine is), and AwaitChange reads its condition again after every
// change until it holds.
#include "base/change_notice.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "absl/time/clock.h"
#include "base/simulated_clock.h"

namespace scd {
namespace {

// The test's own deadline for waits that must end by an event: far, so only a lost wake-up (the
// defect under test) reaches it.
absl::Time Never() { return absl::Now() + absl::Seconds(60); }

TEST(ChangeNoticeTest, AChangeAlreadyCountedEndsTheWaitAtOnce) {
  const uint64_t before = ChangeCount();
  NoteChange();
  EXPECT_GT(AwaitChangeAfter(before, absl::InfinitePast()), before);
  EXPECT_GE(ChangeCount(), before + 1);
}

TEST(ChangeNoticeTest, AChangeFromAnotherThreadWakesTheWaiter) {
  for (int round = 0; round < 200; ++round) {  // each round races the note against the wait
    const uint64_t before = ChangeCount();
    std::thread noter([] { NoteChange(); });
    const uint64_t after = AwaitChangeAfter(before, Never());
    noter.join();
    ASSERT_GT(after, before) << "round " << round << ": the wake-up was lost";
  }
}

TEST(ChangeNoticeTest, WithoutAChangeTheWaitEndsAtItsDeadlineOnTheGivenClock) {
  SimulatedClock clock;
  const absl::Time deadline = clock.Now() + absl::Seconds(5);
  // A count no change reaches: the wait can end only by its deadline.
  const uint64_t unreachable = ChangeCount() + (uint64_t{1} << 62);
  std::atomic<bool> done{false};
  uint64_t seen = 0;
  std::thread waiter([&] {
    seen = AwaitChangeAfter(unreachable, deadline, &clock);
    done = true;
  });
  clock.AwaitPending(1);
  clock.Advance(absl::Seconds(4));
  EXPECT_FALSE(done.load());
  clock.Advance(absl::Seconds(1));
  waiter.join();
  EXPECT_TRUE(done.load());
  EXPECT_LT(seen, unreachable);
}

TEST(ChangeNoticeTest, AwaitChangeReadsItsConditionAgainAfterEachChange) {
  std::atomic<int> done{0};
  std::thread worker([&done] {
    for (int i = 0; i < 1000; ++i) {
      done.fetch_add(1);
      NoteChange();  // after the state changed, as every caller must
    }
  });
  EXPECT_TRUE(AwaitChange([&done] { return done.load() == 1000; }, Never()));
  worker.join();
  // A condition that never holds: false at the deadline (already past here).
  EXPECT_FALSE(AwaitChange([] { return false; }, absl::InfinitePast()));
}

}  // namespace
}  // namespace scd
