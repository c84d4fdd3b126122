// base/finish_reason.h: every reason's name reads back as the reason (the names are the wire's:
// Finished.reason and the OpenAI API's finish_reason), and a name this build does not know reads
// as none.
#include "base/finish_reason.h"

#include <gtest/gtest.h>

namespace scd {
namespace {

TEST(FinishReasonTest, NamesAreTheWiresAndReadBack) {
  EXPECT_EQ(FinishReasonName(FinishReason::kStop), "stop");
  EXPECT_EQ(FinishReasonName(FinishReason::kLength), "length");
  EXPECT_EQ(FinishReasonName(FinishReason::kMaxPositions), "max_positions");
  EXPECT_EQ(FinishReasonName(FinishReason::kCancelled), "cancelled");
  EXPECT_EQ(FinishReasonName(FinishReason::kNone), "");
  for (FinishReason r : {FinishReason::kNone, FinishReason::kStop, FinishReason::kLength,
                         FinishReason::kMaxPositions, FinishReason::kCancelled}) {
    EXPECT_EQ(ParseFinishReason(FinishReasonName(r)), r);
  }
  EXPECT_EQ(ParseFinishReason("content_filter"), FinishReason::kNone);
  EXPECT_EQ(ParseFinishReason("STOP"), FinishReason::kNone);
}

}  // namespace
}  // namespace scd
