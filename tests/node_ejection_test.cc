// coordinator/node_ejection.h on given times (no clock, no socket): a failed call takes a node out
// at once and its first probe is due at once; it comes back only after kProbesToReturn probes in
// a row pass (a failed one starts the count again); one probe at a time, kProbeInterval apart.
#include "coordinator/node_ejection.h"

#include <gtest/gtest.h>

namespace scd::coordinator {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1'000'000);

TEST(NodeEjectionTest, OutAtOnceBackAfterProbesInARow) {
  Ejection e;
  EXPECT_FALSE(TakeProbe(&e, kT0)) << "a node in routing is not probed";
  Eject(&e, kT0, "connection refused");
  EXPECT_TRUE(e.out);
  EXPECT_EQ(e.since, kT0);
  EXPECT_EQ(e.ejections, 1);
  ASSERT_TRUE(TakeProbe(&e, kT0)) << "the first probe is due at once";
  EXPECT_FALSE(TakeProbe(&e, kT0 + absl::Seconds(1))) << "one probe at a time";
  absl::Time now = kT0 + absl::Milliseconds(3);
  for (int pass = 1; pass < kProbesToReturn; ++pass) {
    EXPECT_FALSE(ProbeAnswered(&e, true, now));
    EXPECT_TRUE(e.out);
    EXPECT_FALSE(TakeProbe(&e, now + kProbeInterval - absl::Milliseconds(1)));
    now += kProbeInterval;
    ASSERT_TRUE(TakeProbe(&e, now));
  }
  EXPECT_TRUE(ProbeAnswered(&e, true, now)) << "back after " << kProbesToReturn << " passes";
  EXPECT_FALSE(e.out);
  EXPECT_FALSE(TakeProbe(&e, now + absl::Seconds(1)));
}

TEST(NodeEjectionTest, AFailedProbeStartsTheCountAgain) {
  Ejection e;
  Eject(&e, kT0, "reset");
  absl::Time now = kT0;
  ASSERT_TRUE(TakeProbe(&e, now));
  EXPECT_FALSE(ProbeAnswered(&e, true, now));  // 1 pass
  now += kProbeInterval;
  ASSERT_TRUE(TakeProbe(&e, now));
  EXPECT_FALSE(ProbeAnswered(&e, false, now));  // late: 0 again
  for (int pass = 1; pass < kProbesToReturn; ++pass) {
    now += kProbeInterval;
    ASSERT_TRUE(TakeProbe(&e, now));
    EXPECT_FALSE(ProbeAnswered(&e, true, now));
  }
  now += kProbeInterval;
  ASSERT_TRUE(TakeProbe(&e, now));
  EXPECT_TRUE(ProbeAnswered(&e, true, now));
}

TEST(NodeEjectionTest, AnotherFailedCallWhileOutForgetsThePasses) {
  Ejection e;
  Eject(&e, kT0, "refused");
  ASSERT_TRUE(TakeProbe(&e, kT0));
  EXPECT_FALSE(ProbeAnswered(&e, true, kT0));
  Eject(&e, kT0 + absl::Milliseconds(50), "refused again");
  EXPECT_EQ(e.ejections, 1) << "still the same time out";
  EXPECT_EQ(e.since, kT0);
  EXPECT_EQ(e.why, "refused again");
  ASSERT_TRUE(TakeProbe(&e, kT0 + absl::Milliseconds(50))) << "probed at once again";
  for (int pass = 1; pass < kProbesToReturn; ++pass) {
    EXPECT_FALSE(ProbeAnswered(&e, true, kT0 + absl::Milliseconds(60)));
    ASSERT_TRUE(TakeProbe(&e, kT0 + absl::Seconds(1)));
  }
  EXPECT_TRUE(ProbeAnswered(&e, true, kT0 + absl::Seconds(1)));
  Eject(&e, kT0 + absl::Seconds(2), "gone");
  EXPECT_EQ(e.ejections, 2);
}

}  // namespace
}  // namespace scd::coordinator
