// PendingCall: a parked call comes out once, only when its condition holds, and a second Park
// replaces the first.
#include "base/pending_call.h"

#include <gtest/gtest.h>

namespace scd {
namespace {

TEST(PendingCallTest, ACallComesOutOnceWhenItsConditionHolds) {
  PendingCall pending;
  EXPECT_FALSE(pending.TakeIf(true));  // nothing parked
  int first = 0, second = 0;
  pending.Park([&first] { ++first; });
  EXPECT_FALSE(pending.TakeIf(false));
  EXPECT_TRUE(pending.parked());
  pending.Park([&second] { ++second; });  // replaces the first
  std::function<void()> call = pending.TakeIf(true);
  ASSERT_TRUE(call);
  call();
  EXPECT_EQ(first, 0);
  EXPECT_EQ(second, 1);
  EXPECT_FALSE(pending.parked());
  EXPECT_FALSE(pending.TakeIf(true));  // once
}

}  // namespace
}  // namespace scd
