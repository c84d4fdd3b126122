// StepLog (consumer/step_log.h): its line against sums worked out by hand from three steps, at
// the interval and not before, the window starting again after it, and nothing for an interval
// without steps.
#include "consumer/step_log.h"

#include <gtest/gtest.h>

#include <string>

namespace scd::consumer {
namespace {

// Whether `line` says `part` (a failure shows the whole line).
::testing::AssertionResult Says(const std::string& line, const std::string& part) {
  if (line.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << line << "\" does not say \"" << part << "\"";
}

TEST(StepLogTest, SaysTheIntervalsStepsOnceItPassed) {
  const absl::Time start = absl::UnixEpoch() + absl::Hours(1);
  StepLog log(absl::Seconds(10), start);
  // Decodes alone to measure them (4 sequences, 2 s), 4 decodes beside a 20-token chunk and two
  // rebuild pieces of 32 rows in all (5 s, 1.5 of them the pieces'), a 100-token prefill alone
  // (1 s): 8 s of 10 (80 %), 8/3 s each; 8 decode tokens in 2 steps with decodes (batches of 4);
  // 120 prompt tokens, 20 of them in the one step beside decodes; 32 rebuild rows, 16 and 750 ms
  // a piece.
  log.Add({2, 4, 0, 0, true});
  log.Add({5, 4, 20, 32, false, 2, 1.5});
  log.Add({1, 0, 100, 0, false});
  EXPECT_EQ(log.Line(start + absl::Seconds(9), 0.85, 5), std::nullopt);
  std::optional<std::string> line = log.Line(start + absl::Seconds(10), 0.85, 5);
  ASSERT_TRUE(line.has_value());
  for (const char* says : {"steps over 10.0 s: 3 (busy 80 %, 2666.67 ms each)",
                           "0.8 decode tokens/s in batches of 4.0",
                           "12.0 prompt tokens/s (20.0 a step beside decodes)",
                           "3.2 rebuild rows/s (16.0 rows, 750.00 ms a piece)",
                           "1 measuring decodes alone", "pacer aim 0.85", "5 sequences"}) {
    EXPECT_TRUE(Says(*line, says));
  }
  EXPECT_EQ(log.window().steps, 0);
  // The next interval runs from the line: one step in it, said 10 s later; then an idle one.
  log.Add({0.5, 1, 0, 0, false});
  EXPECT_EQ(log.Line(start + absl::Seconds(19), 0.5, 1), std::nullopt);
  line = log.Line(start + absl::Seconds(20), 0.5, 1);
  ASSERT_TRUE(line.has_value());
  EXPECT_TRUE(Says(*line, "steps over 10.0 s: 1 (busy 5 %, 500.00 ms each)"));
  EXPECT_EQ(log.Line(start + absl::Seconds(31), 0.5, 0), std::nullopt);
}

}  // namespace
}  // namespace scd::consumer
