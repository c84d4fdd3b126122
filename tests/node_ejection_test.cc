// coordinator/node_ejection.h on given times (no clock, no socket): a failed call takes a node out
// at once and its first probe is due at once; it comes back only after kProbesToReturn probes in
// a row pass (a failed one starts the count again); one probe at a time, kProbeInterval apart.
// Advice (another coordinator's ejection) leaves a node in routing until its own probe, due at
// once, says: a pass clears it, a failure ejects it.
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
    EXPECT_EQ(ProbeAnswered(&e, true, now), ProbeOutcome::kNone);
    EXPECT_TRUE(e.out);
    EXPECT_FALSE(TakeProbe(&e, now + kProbeInterval - absl::Milliseconds(1)));
    now += kProbeInterval;
    ASSERT_TRUE(TakeProbe(&e, now));
  }
  EXPECT_EQ(ProbeAnswered(&e, true, now), ProbeOutcome::kBack)
      << "back after " << kProbesToReturn << " passes";
  EXPECT_FALSE(e.out);
  EXPECT_FALSE(TakeProbe(&e, now + absl::Seconds(1)));
}

TEST(NodeEjectionTest, AFailedProbeStartsTheCountAgain) {
  Ejection e;
  Eject(&e, kT0, "reset");
  absl::Time now = kT0;
  ASSERT_TRUE(TakeProbe(&e, now));
  EXPECT_EQ(ProbeAnswered(&e, true, now), ProbeOutcome::kNone);  // 1 pass
  now += kProbeInterval;
  ASSERT_TRUE(TakeProbe(&e, now));
  EXPECT_EQ(ProbeAnswered(&e, false, now), ProbeOutcome::kNone);  // late: 0 again
  for (int pass = 1; pass < kProbesToReturn; ++pass) {
    now += kProbeInterval;
    ASSERT_TRUE(TakeProbe(&e, now));
    EXPECT_EQ(ProbeAnswered(&e, true, now), ProbeOutcome::kNone);
  }
  now += kProbeInterval;
  ASSERT_TRUE(TakeProbe(&e, now));
  EXPECT_EQ(ProbeAnswered(&e, true, now), ProbeOutcome::kBack);
}

TEST(NodeEjectionTest, AnotherFailedCallWhileOutForgetsThePasses) {
  Ejection e;
  Eject(&e, kT0, "refused");
  ASSERT_TRUE(TakeProbe(&e, kT0));
  EXPECT_EQ(ProbeAnswered(&e, true, kT0), ProbeOutcome::kNone);
  Eject(&e, kT0 + absl::Milliseconds(50), "refused again");
  EXPECT_EQ(e.ejections, 1) << "still the same time out";
  EXPECT_EQ(e.since, kT0);
  EXPECT_EQ(e.why, "refused again");
  ASSERT_TRUE(TakeProbe(&e, kT0 + absl::Milliseconds(50))) << "probed at once again";
  for (int pass = 1; pass < kProbesToReturn; ++pass) {
    EXPECT_EQ(ProbeAnswered(&e, true, kT0 + absl::Milliseconds(60)), ProbeOutcome::kNone);
    ASSERT_TRUE(TakeProbe(&e, kT0 + absl::Seconds(1)));
  }
  EXPECT_EQ(ProbeAnswered(&e, true, kT0 + absl::Seconds(1)), ProbeOutcome::kBack);
  Eject(&e, kT0 + absl::Seconds(2), "gone");
  EXPECT_EQ(e.ejections, 2);
}

TEST(NodeEjectionTest, AdviceIsCheckedByAProbeAtOnceAndAPassClearsIt) {
  Ejection e;
  ASSERT_TRUE(Advise(&e, kT0));
  EXPECT_FALSE(e.out) << "advice alone ejects nothing";
  EXPECT_TRUE(e.suspect);
  EXPECT_FALSE(Advise(&e, kT0)) << "suspect already";
  ASSERT_TRUE(TakeProbe(&e, kT0)) << "its probe is due at once";
  EXPECT_FALSE(TakeProbe(&e, kT0 + absl::Seconds(1))) << "one probe at a time";
  EXPECT_EQ(ProbeAnswered(&e, true, kT0 + absl::Milliseconds(2)), ProbeOutcome::kCleared);
  EXPECT_FALSE(e.out);
  EXPECT_FALSE(e.suspect);
  EXPECT_EQ(e.ejections, 0);
  EXPECT_FALSE(TakeProbe(&e, kT0 + absl::Seconds(5))) << "in routing and trusted: no probe";
}

TEST(NodeEjectionTest, AdviceConfirmedByAFailedProbeEjectsAndTheUsualReturnFollows) {
  Ejection e;
  ASSERT_TRUE(Advise(&e, kT0));
  ASSERT_TRUE(TakeProbe(&e, kT0));
  const absl::Time failed = kT0 + kProbeTimeout;
  EXPECT_EQ(ProbeAnswered(&e, false, failed, "advised; own probe: deadline"),
            ProbeOutcome::kEjected);
  EXPECT_TRUE(e.out);
  EXPECT_FALSE(e.suspect);
  EXPECT_EQ(e.since, failed);
  EXPECT_EQ(e.why, "advised; own probe: deadline");
  EXPECT_EQ(e.ejections, 1);
  EXPECT_FALSE(Advise(&e, failed)) << "out already: advice changes nothing";
  absl::Time now = failed;
  for (int pass = 1; pass < kProbesToReturn; ++pass) {
    ASSERT_TRUE(TakeProbe(&e, now));
    EXPECT_EQ(ProbeAnswered(&e, true, now), ProbeOutcome::kNone);
    now += kProbeInterval;
  }
  ASSERT_TRUE(TakeProbe(&e, now));
  EXPECT_EQ(ProbeAnswered(&e, true, now), ProbeOutcome::kBack);
}

TEST(NodeEjectionTest, AFailedCallWhileSuspectEjectsAtOnce) {
  Ejection e;
  ASSERT_TRUE(Advise(&e, kT0));
  ASSERT_TRUE(TakeProbe(&e, kT0));
  Eject(&e, kT0 + absl::Milliseconds(1), "reset");
  EXPECT_TRUE(e.out);
  EXPECT_FALSE(e.suspect);
  // The probe under way answers: it counts as the first of the passes back.
  EXPECT_EQ(ProbeAnswered(&e, true, kT0 + absl::Milliseconds(2)), ProbeOutcome::kNone);
  EXPECT_EQ(e.passes, 1);
  EXPECT_TRUE(e.out);
}

}  // namespace
}  // namespace scd::coordinator
