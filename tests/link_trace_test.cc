// The bandwidth trace's file (bench/link_trace.h), as the sweep and the simulator read it: steps
// parsed and the bad line named, the rate in force at a time, and how long bytes take on a link
// that follows the trace -- against the sums by hand.
#include "bench/link_trace.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

namespace scd::bench {
namespace {

using ::testing::HasSubstr;

TEST(LinkTraceTest, ParsesStepsAndNamesTheBadLine) {
  absl::StatusOr<std::vector<TraceStep>> trace =
      ParseBandwidthTrace("# a trace\n0 inf\n\n2.5 0.01  # down\n4,1\n");
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->size(), 3u);
  EXPECT_TRUE(std::isinf((*trace)[0].gbps));
  EXPECT_DOUBLE_EQ((*trace)[1].at_s, 2.5);
  EXPECT_DOUBLE_EQ(RateAt(*trace, 3), 0.01);
  EXPECT_DOUBLE_EQ(RateAt(*trace, 9), 1);
  EXPECT_TRUE(std::isinf(RateAt(*trace, 0.1)));
  for (const auto& [text, why] : std::vector<std::pair<std::string, std::string>>{
           {"1 0.1\n", "line 1: times must start at 0"},
           {"0 0.1\n0 1\n", "line 2: times must start at 0 and ascend"},
           {"0 -1\n", "line 1: '0 -1' is not"},
           {"0 fast\n", "line 1"},
           {"0 1 2\n", "line 1"},
           {"# nothing\n", "no step"}}) {
    EXPECT_THAT(ParseBandwidthTrace(text).status().message(), HasSubstr(why)) << text;
  }
}

TEST(LinkTraceTest, BytesCrossAtEachStepsRateForAsLongAsItIsInForce) {
  // 8 Mbit/s (1 MB/s) for the first 2 s, then 80 Mbit/s (10 MB/s), then unshaped from 10 s.
  const std::vector<TraceStep> trace = {{0, 0.008}, {2, 0.08}, {10, INFINITY}};
  EXPECT_DOUBLE_EQ(TraceSendSeconds(trace, 0, 1e6), 1);             // within the first step
  EXPECT_DOUBLE_EQ(TraceSendSeconds(trace, 1.5, 1e6), 0.5 + 0.05);  // 0.5 MB, then 0.5 at 10
  EXPECT_DOUBLE_EQ(TraceSendSeconds(trace, 3, 1e7), 1);             // the second step
  EXPECT_DOUBLE_EQ(TraceSendSeconds(trace, 9, 2e7), 1);             // 1e7 by 10 s, the rest free
  EXPECT_DOUBLE_EQ(TraceSendSeconds(trace, 12, 1e12), 0);           // unshaped
  EXPECT_DOUBLE_EQ(TraceSendSeconds(trace, 5, 0), 0);
  // After the last step its rate holds.
  const std::vector<TraceStep> slow = {{0, INFINITY}, {1, 0.008}};
  EXPECT_DOUBLE_EQ(TraceSendSeconds(slow, 0.5, 3e6), 0);  // all across before the drop
  EXPECT_DOUBLE_EQ(TraceSendSeconds(slow, 100, 1e6), 1);
}

}  // namespace
}  // namespace scd::bench
