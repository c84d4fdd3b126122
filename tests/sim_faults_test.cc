// FrozenSpans, the simulator's freezes (bench/sim_faults.h), against sums by hand: work around
// one or two freezes ends as late as the freezes it meets, the active time in a window is the
// window less what the freezes cover, and a freeze that overlaps another or does not last is
// refused; a keepalive gives up on a frozen peer at the deadline of the first ping sent into the
// freeze, unless the thaw answers it first.
#include "bench/sim_faults.h"

#include <gtest/gtest.h>

namespace scd::bench {
namespace {

absl::Time T(double s) { return absl::UnixEpoch() + absl::Seconds(s); }

TEST(FrozenSpansTest, WithoutFreezesWorkEndsAfterItself) {
  FrozenSpans none;
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(none.EndOf(T(1), absl::Seconds(2)), T(3));
  EXPECT_EQ(none.Active(T(1), T(4)), absl::Seconds(3));
  EXPECT_FALSE(none.Frozen(T(1)));
}

TEST(FrozenSpansTest, WorkEndsAsLateAsTheFreezesItMeets) {
  FrozenSpans f;
  ASSERT_TRUE(f.Add(T(10), T(13)).ok());
  ASSERT_TRUE(f.Add(T(20), T(21)).ok());
  EXPECT_FALSE(f.Frozen(T(9.5)));
  EXPECT_TRUE(f.Frozen(T(10)));  // a freeze holds its start
  EXPECT_EQ(f.ThawOf(T(11)), T(13));
  EXPECT_FALSE(f.Frozen(T(13)));  // and not its end
  // Before the first: 1 s of work from 8 s ends at 9; 3 s of it meets the first freeze (2 s
  // before, 1 s after the thaw at 13); 12 s meets both (2 before, 7 between, 3 after).
  EXPECT_EQ(f.EndOf(T(8), absl::Seconds(1)), T(9));
  EXPECT_EQ(f.EndOf(T(8), absl::Seconds(3)), T(14));
  EXPECT_EQ(f.EndOf(T(8), absl::Seconds(12)), T(24));
  // Work that starts frozen starts at the thaw; work that ends at a freeze's start ends there.
  EXPECT_EQ(f.EndOf(T(11), absl::Seconds(1)), T(14));
  EXPECT_EQ(f.EndOf(T(8), absl::Seconds(2)), T(10));
  // Active time: the window less what the freezes cover of it.
  EXPECT_EQ(f.Active(T(8), T(9)), absl::Seconds(1));
  EXPECT_EQ(f.Active(T(8), T(14)), absl::Seconds(3));
  EXPECT_EQ(f.Active(T(11), T(12)), absl::ZeroDuration());
  EXPECT_EQ(f.Active(T(12), T(22)), absl::Seconds(8));
  EXPECT_EQ(f.Active(T(5), T(5)), absl::ZeroDuration());
}

TEST(FrozenSpansTest, AFreezeThatOverlapsAnotherOrDoesNotLastIsRefused) {
  FrozenSpans f;
  ASSERT_TRUE(f.Add(T(10), T(13)).ok());
  EXPECT_FALSE(f.Add(T(12), T(14)).ok());
  EXPECT_FALSE(f.Add(T(9), T(11)).ok());
  EXPECT_FALSE(f.Add(T(9), T(14)).ok());
  EXPECT_FALSE(f.Add(T(15), T(15)).ok());
  EXPECT_TRUE(f.Add(T(13), T(14)).ok());  // from the thaw on
  EXPECT_TRUE(f.Add(T(5), T(10)).ok());   // up to the freeze
  EXPECT_EQ(f.EndOf(T(4), absl::Seconds(2)), T(15));
}

// Pings every 0.5 s from 0, 1 s to answer: a freeze from 1.2 s meets the ping at 1.5 s, whose
// deadline is 2.5 s; a freeze from exactly 1.5 s the same ping; a thaw at or before the deadline
// answers it (no give-up), however many pings went unanswered meanwhile.
TEST(KeepaliveTest, GivesUpAtTheDeadlineOfTheFirstPingIntoTheFreeze) {
  const absl::Duration every = absl::Milliseconds(500), timeout = absl::Seconds(1);
  EXPECT_EQ(KeepaliveGivesUp(T(0), every, timeout, T(1.2), T(4)), T(2.5));
  EXPECT_EQ(KeepaliveGivesUp(T(0), every, timeout, T(1.5), T(4)), T(2.5));
  EXPECT_EQ(KeepaliveGivesUp(T(0), every, timeout, T(1.2), T(2.5)), std::nullopt);
  EXPECT_EQ(KeepaliveGivesUp(T(0), every, timeout, T(1.2), T(2.4)), std::nullopt);
  EXPECT_EQ(KeepaliveGivesUp(T(0), every, timeout, T(1.2), T(2.6)), T(2.5));
  // The gRPC transport's sessions: every 250 ms, 750 ms to answer.
  EXPECT_EQ(
      KeepaliveGivesUp(T(0), absl::Milliseconds(250), absl::Milliseconds(750), T(1.001), T(3)),
      T(2));
}

}  // namespace
}  // namespace scd::bench
