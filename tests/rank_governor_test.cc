// RankGovernor against hand-computed budgets: the scale is the share of the remaining scalable
// bytes that drain by the deadline at the goodput known now, after what is in flight and what
// cannot shrink; 1 while the budget holds, without a budget, or with no goodput known.
#include "codec/rank_governor.h"

#include <gtest/gtest.h>

namespace scd {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1000);

// Four layers of 1000 scalable bytes; layer 3 also carries 500 fixed bytes.
std::vector<LayerBytes> FourLayers() { return {{1000, 0}, {1000, 0}, {1000, 0}, {1000, 500}}; }

TEST(RankGovernorTest, FullRankWhileTheBudgetHoldsOrNothingIsKnown) {
  RankGovernor none({}, FourLayers(), kStart);  // no budget: never adapts
  EXPECT_EQ(none.ScaleFor(0, kStart, 0), 1.0);
  RankGovernor unknown({absl::Milliseconds(1), 0}, FourLayers(), kStart);  // no goodput yet
  EXPECT_EQ(unknown.ScaleFor(2, kStart + absl::Seconds(5), 10000), 1.0);
  // 4500 bytes at 10 kB/s in 1 s: room for 10000 bytes.
  RankGovernor ample({absl::Seconds(1), 10000}, FourLayers(), kStart);
  EXPECT_EQ(ample.ScaleFor(0, kStart, 0), 1.0);
}

TEST(RankGovernorTest, ScaleIsTheRunningBudgetOverTheBytesLeft) {
  // Planned 2000 B/s, 2 s: at the start, room 4000 - 500 fixed over 4000 scalable = 0.875.
  RankGovernor governor({absl::Seconds(2), 2000}, FourLayers(), kStart);
  EXPECT_DOUBLE_EQ(governor.ScaleFor(0, kStart, 0), 3500.0 / 4000.0);
  // A drain measured at 1000 B/s: at t = 1 s, layer 2 with 300 bytes in flight:
  // room 1000 * 1 - 300 - 500 = 200 over 2000 scalable = 0.1.
  governor.ObserveDrain(500, absl::Milliseconds(500));
  EXPECT_DOUBLE_EQ(governor.goodput(), 1000.0);
  EXPECT_DOUBLE_EQ(governor.ScaleFor(2, kStart + absl::Seconds(1), 300), 200.0 / 2000.0);
  // The link recovers (the latest drain counts, not an average): full rank again.
  governor.ObserveDrain(100000, absl::Milliseconds(10));
  EXPECT_EQ(governor.ScaleFor(2, kStart + absl::Seconds(1), 300), 1.0);
  // Past the deadline: the smallest scale (every code at rank 1).
  EXPECT_GT(governor.ScaleFor(3, kStart + absl::Seconds(3), 0), 0.0);
  EXPECT_LT(governor.ScaleFor(3, kStart + absl::Seconds(3), 0), 1e-6);
}

TEST(RankGovernorTest, ALayerInPiecesCountsOnlyThePositionsLeft) {
  // Planned 1000 B/s, 2 s, at t = 1 s, layer 3 with a quarter of its positions left (its fixed
  // 500 bytes went with its first piece, in flight): room 1000 - 200 in flight over 250 = 1.
  RankGovernor governor({absl::Seconds(2), 1000}, FourLayers(), kStart);
  EXPECT_EQ(governor.ScaleFor(3, kStart + absl::Seconds(1), 200, absl::InfinitePast(), 0.25), 1.0);
  // Layer 2 with half left: 500 + 1000 scalable, 500 fixed; room 1000 - 200 - 500 = 300.
  EXPECT_DOUBLE_EQ(
      governor.ScaleFor(2, kStart + absl::Seconds(1), 200, absl::InfinitePast(), 0.5),
      300.0 / 1500.0);
  // The whole layer left: its share is 1, as without pieces.
  EXPECT_DOUBLE_EQ(governor.ScaleFor(2, kStart + absl::Seconds(1), 200, absl::InfinitePast(), 1.0),
                   governor.ScaleFor(2, kStart + absl::Seconds(1), 200));
}

TEST(RankGovernorTest, APassLaterThanTheBudgetMovesTheDeadline) {
  // 1000 B/s, 1 s: at t = 1 s nothing is left of the budget, but the pass will make its last
  // layer only at t = 3 s: the link has 2 s for layers 2-3 (2000 scalable + 500 fixed).
  RankGovernor governor({absl::Seconds(1), 1000}, FourLayers(), kStart);
  const absl::Time now = kStart + absl::Seconds(1);
  EXPECT_LT(governor.ScaleFor(2, now, 0), 1e-6);
  EXPECT_DOUBLE_EQ(governor.ScaleFor(2, now, 0, kStart + absl::Seconds(3)), 1500.0 / 2000.0);
  EXPECT_LT(governor.ScaleFor(2, now, 0, kStart), 1e-6);  // an earlier pass changes nothing
}

TEST(RankGovernorTest, ShortOrEmptyDrainsAreIgnored) {
  RankGovernor governor({absl::Seconds(1), 0}, FourLayers(), kStart);
  governor.ObserveDrain(1 << 20, absl::Microseconds(100));
  governor.ObserveDrain(0, absl::Seconds(1));
  EXPECT_EQ(governor.goodput(), 0.0);
}

TEST(RankGovernorTest, ScaledRanksStayNestedAndAtLeastOne) {
  EXPECT_EQ(RankGovernor::ScaledRank(16, 1.0), 16);
  EXPECT_EQ(RankGovernor::ScaledRank(16, 0.5), 8);
  EXPECT_EQ(RankGovernor::ScaledRank(16, 0.49), 7);
  EXPECT_EQ(RankGovernor::ScaledRank(16, 1e-9), 1);
  EXPECT_EQ(RankGovernor::ScaledRank(0, 0.5), 0);  // a code that does not travel
}

}  // namespace
}  // namespace scd
