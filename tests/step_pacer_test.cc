// StepPacer against costs given by formula: a step of d decodes and p prompt tokens takes
// decode(d) + (p > 0 ? fixed + per_token * p : 0) seconds, so the chunk it should converge to is
// known in closed form: 0.85 * allowed - min(fixed, 0.85 * allowed / 2), over per_token.
#include "consumer/step_pacer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

namespace scd::consumer {
namespace {

struct Costs {
  double base, per_decode, fixed, per_token;
  double Step(int64_t decodes, int64_t tokens) const {
    return base + per_decode * static_cast<double>(decodes) +
           (tokens > 0 ? fixed + per_token * static_cast<double>(tokens) : 0.0);
  }
};

// Runs the scheduler's loop against `costs` for `steps` steps with `decodes` decodes and a
// prompt always waiting; returns the last chunk granted.
int64_t Converge(StepPacer& pacer, const Costs& costs, int64_t decodes, int steps) {
  int64_t chunk = 0;
  for (int i = 0; i < steps; ++i) {
    if (pacer.NeedsMeasure(decodes)) {
      pacer.Observe(decodes, 0, costs.Step(decodes, 0), 0);
      continue;
    }
    const double allowed = pacer.Allowed(decodes);
    chunk = std::max<int64_t>(2, pacer.ChunkTokens(allowed));  // the floor
    pacer.Observe(decodes, chunk, costs.Step(decodes, chunk), allowed);
  }
  return chunk;
}

double Expected(const Costs& costs, int64_t decodes, double slack) {
  const double allowed = (slack - 1) * costs.Step(decodes, 0);
  const double aim = 0.85 * allowed;
  return (aim - std::min(costs.fixed, aim / 2)) / costs.per_token;
}

TEST(StepPacerTest, DecodesAreMeasuredFirstAndAgainWhenTheirMeasureIsOld) {
  StepPacer pacer(2.0, 64);
  EXPECT_FALSE(pacer.NeedsMeasure(0));
  EXPECT_TRUE(pacer.NeedsMeasure(3));
  EXPECT_EQ(pacer.DecodeStepEstimate(3), 0);
  EXPECT_EQ(pacer.ChunkTokens(pacer.Allowed(3)), 0);  // nothing known: the floor measures
  pacer.Observe(3, 0, 0.004, 0);
  EXPECT_FALSE(pacer.NeedsMeasure(3));
  EXPECT_TRUE(pacer.NeedsMeasure(4));                  // another count: its own measure
  EXPECT_DOUBLE_EQ(pacer.DecodeStepEstimate(4), 0.004);  // meanwhile the nearest below
  EXPECT_DOUBLE_EQ(pacer.DecodeStepEstimate(1), 0.004);  // or above
  EXPECT_DOUBLE_EQ(pacer.Allowed(3), 0.004);
  EXPECT_TRUE(std::isinf(pacer.Allowed(0)));
  for (int i = 0; i < 64; ++i) pacer.Observe(3, 8, 0.006, 0.004);
  EXPECT_FALSE(pacer.NeedsMeasure(3));
  pacer.Observe(3, 8, 0.006, 0.004);
  EXPECT_TRUE(pacer.NeedsMeasure(3)) << "65 steps since its measure";
  // A step that took no time (a simulated clock nobody advanced) is measured all the same: the
  // decodes are not run alone again and again, starving the prompts.
  StepPacer instant(2.0, 64);
  instant.Observe(1, 0, 0.0, 0);
  EXPECT_FALSE(instant.NeedsMeasure(1));
  EXPECT_EQ(instant.Allowed(1), 0);
}

TEST(StepPacerTest, TheChunkConvergesToWhatFitsTheStep) {
  // A mid-size model: the fixed part small beside the time left.
  const Costs costs{0.002, 0.0005, 0.0002, 0.00005};
  StepPacer pacer(2.0, 64);
  const int64_t chunk = Converge(pacer, costs, 8, 200);
  const double expected = Expected(costs, 8, 2.0);  // (0.85 * 6 ms - 0.2 ms) / 0.05 ms = 98
  EXPECT_NEAR(static_cast<double>(chunk), expected, 1.0);
  const auto line = pacer.ChunkLine();
  ASSERT_TRUE(line.has_value());
  // The costs lie on the line exactly: only rounding in sums of a few hundred terms (p^2 up to
  // 1e4) separates the fit from them, far below a millionth of either.
  EXPECT_NEAR(line->first, costs.fixed, 1e-6 * costs.fixed);
  EXPECT_NEAR(line->second, costs.per_token, 1e-6 * costs.per_token);
  // The step it plans stays within the slack.
  EXPECT_LE(costs.Step(8, chunk), 2.0 * costs.Step(8, 0));
}

TEST(StepPacerTest, AFixedCostNearAStepCountsOnlyHalfTheTimeLeft) {
  // A model so small that one more segment costs about a decode step.
  const Costs costs{0.0008, 0.00002, 0.0007, 0.00001};
  StepPacer pacer(2.0, 64);
  const int64_t chunk = Converge(pacer, costs, 4, 200);
  EXPECT_NEAR(static_cast<double>(chunk), Expected(costs, 4, 2.0), 1.0);
  EXPECT_GT(chunk, 10) << "prompts would move at the floor";
}

// The failure this design answers: a batch that grows while prompts keep arriving never runs
// its decodes alone, and a step of 1 decode standing for 8 made every prompt token look costly.
TEST(StepPacerTest, ABatchGrowingWhilePromptsWaitKeepsItsChunk) {
  const Costs costs{0.001, 0.0006, 0.0002, 0.00008};
  StepPacer pacer(2.0, 64);
  Converge(pacer, costs, 1, 50);
  for (int64_t decodes = 2; decodes <= 8; ++decodes) {
    const int64_t chunk = Converge(pacer, costs, decodes, 12);
    EXPECT_NEAR(static_cast<double>(chunk), Expected(costs, decodes, 2.0), 2.0)
        << decodes << " decodes";
  }
}

TEST(StepPacerTest, UntilALineIsDeterminedChunksGrowToFitOne) {
  StepPacer pacer(2.0, 64);
  pacer.Observe(2, 0, 0.002, 0);
  pacer.Observe(2, 2, 0.003, 0.002);  // 1 ms for 2 tokens: 0.5 ms each, so far
  EXPECT_FALSE(pacer.ChunkLine().has_value());
  // 0.85 * 2 ms / 0.5 ms = 3 tokens, but at least twice the last to see another size.
  EXPECT_EQ(pacer.ChunkTokens(pacer.Allowed(2)), 4);
  pacer.Observe(2, 4, 0.0032, 0.002);
  EXPECT_TRUE(pacer.ChunkLine().has_value());
}

// Steps that come out past their time (a busy core every fourth step, doubling it) trim the
// chunk; once they stop, it grows back to what fits.
TEST(StepPacerTest, StepsPastTheirTimeTrimTheChunkUntilTheyStop) {
  const Costs costs{0.002, 0.0005, 0.0002, 0.00005};
  StepPacer pacer(2.0, 64);
  const int64_t quiet = Converge(pacer, costs, 8, 200);
  EXPECT_DOUBLE_EQ(pacer.aim(), 0.85);
  int64_t chunk = 0;
  for (int i = 0; i < 200; ++i) {
    if (pacer.NeedsMeasure(8)) {
      pacer.Observe(8, 0, costs.Step(8, 0), 0);
      continue;
    }
    const double allowed = pacer.Allowed(8);
    chunk = std::max<int64_t>(2, pacer.ChunkTokens(allowed));
    pacer.Observe(8, chunk, costs.Step(8, chunk) * (i % 4 == 0 ? 2.0 : 1.0), allowed);
  }
  EXPECT_LT(pacer.aim(), 0.85 * 0.5) << "a quarter of the steps past their time";
  EXPECT_LT(chunk, quiet / 2);
  const int64_t after = Converge(pacer, costs, 8, 400);
  EXPECT_DOUBLE_EQ(pacer.aim(), 0.85);
  EXPECT_NEAR(static_cast<double>(after), static_cast<double>(quiet), 1.0);
}

// A chunk at the plan's floor where the time left held none (rebuild pieces took it) is not the
// pacer's: its overruns leave the aim, which then sizes the chunks after the pieces in full --
// while the same overruns on chunks it sized trim it (the test above).
TEST(StepPacerTest, ChunksAtThePlansFloorNeitherTrimNorGiveBack) {
  const Costs costs{0.002, 0.0005, 0.0002, 0.00005};
  StepPacer pacer(2.0, 64);
  const int64_t quiet = Converge(pacer, costs, 8, 200);
  ASSERT_DOUBLE_EQ(pacer.aim(), 0.85);
  ASSERT_GT(quiet, 2);
  double least_aim = 1;  // over the floor chunks (the line soon moves to their cost)
  for (int i = 0; i < 200; ++i) {
    if (pacer.NeedsMeasure(8)) {
      pacer.Observe(8, 0, costs.Step(8, 0), 0);
      continue;
    }
    const double left = 1e-5;  // what the pieces left: under a token's cost
    ASSERT_LT(pacer.ChunkTokens(left), 2);
    // Every floor chunk past its time (twice its cost), as quota stalls make them.
    pacer.Observe(8, 2, costs.Step(8, 0) + 2 * (costs.fixed + 2 * costs.per_token), left);
    least_aim = std::min(least_aim, pacer.aim());
  }
  EXPECT_DOUBLE_EQ(least_aim, 0.85);
  // The same overrun on a chunk it sized trims.
  const double allowed = pacer.Allowed(8);
  const int64_t chunk = pacer.ChunkTokens(allowed);
  ASSERT_GE(chunk, 2);
  pacer.Observe(8, chunk, costs.Step(8, chunk) + costs.Step(8, chunk) - costs.Step(8, 0), allowed);
  EXPECT_DOUBLE_EQ(pacer.aim(), 0.85 * 0.8);
}

// The local prefill's ITL cost: a step's time past its decodes' estimate over its prompt tokens,
// older steps weighing 0.95 a step. Decodes at 1 ms; chunks of 10 tokens adding 0.3 ms, then of
// 20 adding 0.4 ms: (0.95 * 0.3 + 0.4) ms over (0.95 * 10 + 20) tokens.
TEST(StepPacerTest, TheLocalItlCostIsWhatPromptTokensAddPerToken) {
  StepPacer pacer(2.0, 64);
  pacer.Observe(1, 10, 0.0013, 0.001);
  EXPECT_EQ(pacer.local_itl().UsPerToken(), 0) << "no decode measured: nothing to compare with";
  pacer.Observe(1, 0, 0.001, 0);
  pacer.Observe(1, 10, 0.0013, 0.001);
  EXPECT_NEAR(pacer.local_itl().UsPerToken(), 30, 1e-9);
  pacer.Observe(1, 20, 0.0014, 0.001);
  EXPECT_NEAR(pacer.local_itl().UsPerToken(), (0.95 * 300 + 400) / (0.95 * 10 + 20), 1e-9);
  // A step that came out under the estimate (the decodes measured in a slower moment) adds its
  // tokens at no cost: the cost shrinks, it never goes negative.
  const double before = pacer.local_itl().UsPerToken();
  pacer.Observe(1, 10, 0.0008, 0.001);
  EXPECT_NEAR(pacer.local_itl().UsPerToken(),
              0.95 * (0.95 * 300 + 400) / (0.95 * (0.95 * 10 + 20) + 10), 1e-9);
  EXPECT_LT(pacer.local_itl().UsPerToken(), before);
}

}  // namespace
}  // namespace scd::consumer
