// PlanStep, the decode scheduler's policy, with no model, no thread and no clock: the state is
// written by hand, the pacer taught costs by formula (as step_pacer_test does), and each verdict
// derived from the rules in consumer/step_plan.h. These judge what decode_scheduler_test judged
// on a real model and the wall clock (tests/simulated_clock.md): decodes never wait, leaves
// happen between steps at the deadline and not before, rebuild work runs in order in pieces of at
// least 16 rows, prompt chunks stay within the pacing budget and never starve.
#include "consumer/step_plan.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

namespace scd::consumer {
namespace {

constexpr double kSlack = 2.0;
constexpr int64_t kSkinny = 64;

const absl::Time kNow = absl::FromUnixSeconds(1'000'000);

PlannedSequence Decoding() { return {true, 0, false, absl::InfiniteFuture()}; }
PlannedSequence Prompt(int64_t left) { return {false, left, false, absl::InfiniteFuture()}; }

StepLimits Limits(int layers = 4, int64_t max_batched = 512) {
  return {max_batched, layers, kSkinny};
}

// A pacer that has measured `decodes` decodes at `step_s` seconds and learnt chunk costs of
// `fixed` + `per_token` * tokens beside them (chunks of spread sizes, so a line is fitted).
StepPacer Taught(int64_t decodes, double step_s, double fixed, double per_token) {
  StepPacer pacer(kSlack, kSkinny);
  pacer.Observe(decodes, 0, step_s, 0);
  for (int64_t tokens : {4, 12, 8, 16, 6, 10}) {
    pacer.Observe(decodes, tokens,
                  step_s + fixed + per_token * static_cast<double>(tokens),
                  pacer.Allowed(decodes));
  }
  return pacer;
}

TEST(StepPlanTest, EveryDecodeRunsFirstAndAPromptTakesTheWholeBudgetWithNoDecodes) {
  StepPacer pacer(kSlack, kSkinny);
  StepState state{kNow, {Prompt(1000)}, {}, 0};
  StepPlan plan = PlanStep(state, pacer, Limits(4, 512));
  EXPECT_EQ(plan.decodes, 0);
  EXPECT_FALSE(plan.decodes_only);
  EXPECT_TRUE(std::isinf(plan.allowed));
  EXPECT_EQ(plan.chunk_budget, 512);  // no decodes: every row of the step
  ASSERT_EQ(plan.batch.size(), 1u);
  EXPECT_EQ(plan.batch[0].chunk, 512);
  EXPECT_EQ(plan.prefill_tokens, 512);

  // Two decodes joined, measured: they go first, one row each; the prompt gets the pacer's
  // chunk beside them.
  pacer = Taught(2, 0.010, 0.001, 0.0001);
  state.sequences = {Prompt(1000), Decoding(), Decoding()};
  plan = PlanStep(state, pacer, Limits(4, 512));
  EXPECT_EQ(plan.decodes, 2);
  ASSERT_EQ(plan.batch.size(), 3u);
  EXPECT_EQ(plan.batch[0].sequence, 1u);
  EXPECT_EQ(plan.batch[0].chunk, 0);
  EXPECT_EQ(plan.batch[1].sequence, 2u);
  EXPECT_EQ(plan.batch[2].sequence, 0u);
  // (slack - 1) * 10 ms of room; the chunk is the pacer's for it, within the skinny rows.
  EXPECT_DOUBLE_EQ(plan.allowed, 0.010);
  const int64_t want = std::min<int64_t>(pacer.ChunkTokens(0.010), kSkinny - 2);
  EXPECT_GT(want, kMinChunk);
  EXPECT_EQ(plan.chunk_budget, want);
  EXPECT_EQ(plan.batch[2].chunk, want);
}

TEST(StepPlanTest, UnmeasuredDecodesRunAloneWithNoPromptAndNoPiece) {
  StepPacer pacer(kSlack, kSkinny);  // nothing measured
  StepState state{kNow, {Decoding(), Prompt(100)}, {{64, 4}}, 0};
  StepPlan plan = PlanStep(state, pacer, Limits());
  EXPECT_TRUE(plan.decodes_only);
  EXPECT_TRUE(plan.pieces.empty());
  ASSERT_EQ(plan.batch.size(), 1u);
  EXPECT_EQ(plan.batch[0].chunk, 0);
  EXPECT_EQ(plan.prefill_tokens, 0);
}

TEST(StepPlanTest, APromptNeverStarvesBesideDecodes) {
  // Decodes so slow to measure that the pacer grants no chunk: the floor of 2 tokens still goes.
  StepPacer pacer(1.0, kSkinny);  // no slack at all: nothing allowed beside the decodes
  pacer.Observe(1, 0, 0.010, 0);
  StepState state{kNow, {Decoding(), Prompt(100), Prompt(100)}, {}, 0};
  StepPlan plan = PlanStep(state, pacer, Limits());
  EXPECT_EQ(plan.chunk_budget, 0);
  ASSERT_EQ(plan.batch.size(), 2u);
  EXPECT_EQ(plan.batch[1].sequence, 1u);  // the oldest prompt
  EXPECT_EQ(plan.batch[1].chunk, kMinChunk);
  // A prompt with one token left takes just that.
  state.sequences[1] = Prompt(1);
  plan = PlanStep(state, pacer, Limits());
  ASSERT_EQ(plan.batch.size(), 2u);
  EXPECT_EQ(plan.batch[1].chunk, 1);
}

TEST(StepPlanTest, ChunksGoOldestFirstWithinTheRowsOfTheStep) {
  StepPacer pacer(kSlack, kSkinny);
  StepState state{kNow, {Prompt(300), Prompt(300), Prompt(300)}, {}, 0};
  const StepPlan plan = PlanStep(state, pacer, Limits(4, 512));
  ASSERT_EQ(plan.batch.size(), 2u);
  EXPECT_EQ(plan.batch[0].chunk, 300);
  EXPECT_EQ(plan.batch[1].chunk, 212);
  EXPECT_EQ(plan.prefill_tokens, 512);
}

TEST(StepPlanTest, SequencesLeaveAtTheirDeadlineNotBeforeAndWhenCancelled) {
  StepPacer pacer(kSlack, kSkinny);
  pacer.Observe(2, 0, 0.010, 0);
  PlannedSequence due = Decoding();
  due.deadline = kNow + absl::Milliseconds(30);
  PlannedSequence cancelled = Prompt(50);
  cancelled.cancelled = true;
  StepState state{kNow + absl::Milliseconds(30), {Decoding(), due, cancelled}, {}, 0};
  StepPlan plan = PlanStep(state, pacer, Limits());
  ASSERT_EQ(plan.leaves.size(), 1u);  // at its deadline it still runs
  EXPECT_EQ(plan.leaves[0].sequence, 2u);
  EXPECT_EQ(plan.leaves[0].why, StepLeave::kCancelled);
  EXPECT_EQ(plan.decodes, 2);

  state.now += absl::Microseconds(1);  // past it
  plan = PlanStep(state, pacer, Limits());
  ASSERT_EQ(plan.leaves.size(), 2u);
  EXPECT_EQ(plan.leaves[0].sequence, 1u);
  EXPECT_EQ(plan.leaves[0].why, StepLeave::kDeadline);
  EXPECT_EQ(plan.decodes, 1);  // the others go on
  for (const StepPlan::Member& m : plan.batch) EXPECT_EQ(m.sequence, 0u);
}

TEST(StepPlanTest, RebuildWorkRunsInOrderInPiecesOfAtLeastSixteenRows) {
  // Beside a decode, with 1 ms per row and layer measured and 10 ms allowed: a 4-layer piece
  // costs 4 ms a row, so 2 rows fit -- the floor makes it 16; the next work waits.
  StepPacer pacer(kSlack, kSkinny);
  pacer.Observe(1, 0, 0.010, 0);
  StepState state{kNow, {Decoding()}, {{100, 4}, {50, 4}}, 0.001};
  StepPlan plan = PlanStep(state, pacer, Limits(4));
  ASSERT_EQ(plan.pieces.size(), 1u);
  EXPECT_EQ(plan.pieces[0].work, 0u);
  EXPECT_EQ(plan.pieces[0].rows, kMinPieceRows);
  // Cheaper rows: as many as the time allows, 10 ms / (0.01 ms * 4) = 250, capped by the rows
  // left (512 - 1 decode) -- the whole first work, then the second.
  state.rebuild_row_layer_s = 1e-5;
  plan = PlanStep(state, pacer, Limits(4));
  ASSERT_EQ(plan.pieces.size(), 2u);
  EXPECT_EQ(plan.pieces[0].rows, 100);
  EXPECT_EQ(plan.pieces[1].work, 1u);
  EXPECT_EQ(plan.pieces[1].rows, 50);
  EXPECT_NEAR(plan.chunk_allowed, 0.010 - 150 * 4e-5, 1e-12);
  // No decodes: no time bound, the rows' alone (2 layers of 4 cost half a row each).
  state.sequences.clear();
  state.work = {{2000, 2}};
  plan = PlanStep(state, pacer, Limits(4, 512));
  ASSERT_EQ(plan.pieces.size(), 1u);
  EXPECT_EQ(plan.pieces[0].rows, 1024);
  EXPECT_EQ(plan.chunk_budget, 0);
  // Nothing measured yet beside decodes: 16 rows, to measure them.
  state = {kNow, {Decoding()}, {{100, 4}}, 0};
  plan = PlanStep(state, pacer, Limits(4));
  ASSERT_EQ(plan.pieces.size(), 1u);
  EXPECT_EQ(plan.pieces[0].rows, kMinPieceRows);
}

// A receive's layers, as the knee's consumers ran them (bench/README.md): each layer's 144 code
// rows in 1.3 ms (9 us a row), then the prompt's last token through that layer, one row in
// 0.4 ms. Weighed by rows, the price is about their time over their rows, 1.7 ms / 145 = 11.7 us
// (the newest tail weighs a little more than the older pieces: 11.9), above the code rows' 9 and
// under 12; a layer fits a step's 3.6 ms beside a decode as one piece. Averaged piece by piece
// (the newest a quarter), a tail had priced the next layer at 0.25 x 400 + 0.75 x 9 ~ 107 us a
// row: pieces of 33 rows, a step each.
TEST(StepPlanTest, APiecesPriceWeighsItByItsRowsSoOneRowPiecesDoNotSplitTheNext) {
  RebuildPrice price;
  EXPECT_EQ(price.RowLayerSeconds(), 0);
  price.Observe(0.002, 100, 0);  // no layers: not priced
  EXPECT_EQ(price.RowLayerSeconds(), 0);
  price.Observe(0.001, 50, 2);
  EXPECT_DOUBLE_EQ(price.RowLayerSeconds(), 1e-5);
  price = RebuildPrice();
  for (int layer = 0; layer < 6; ++layer) {
    price.Observe(1.3e-3, 144, 1);
    price.Observe(0.4e-3, 1, 1);
  }
  EXPECT_GT(price.RowLayerSeconds(), 9e-6);
  EXPECT_LT(price.RowLayerSeconds(), 12e-6);
  StepPacer pacer(kSlack, kSkinny);
  pacer.Observe(1, 0, 0.0036, 0);
  const StepState state{kNow, {Decoding()}, {{144, 1}}, price.RowLayerSeconds()};
  const StepPlan plan = PlanStep(state, pacer, Limits(6));
  ASSERT_EQ(plan.pieces.size(), 1u);
  EXPECT_EQ(plan.pieces[0].rows, 144);
}

TEST(StepPlanTest, APieceLeavesTheRestOfTheStepToPrompts) {
  // 512 rows, 100 rebuild rows over all 4 layers count 100; no decodes: a prompt gets 412.
  StepPacer pacer(kSlack, kSkinny);
  StepState state{kNow, {Prompt(1000)}, {{100, 4}}, 0.001};
  const StepPlan plan = PlanStep(state, pacer, Limits(4, 512));
  ASSERT_EQ(plan.pieces.size(), 1u);
  EXPECT_EQ(plan.pieces[0].rows, 100);
  EXPECT_EQ(plan.chunk_budget, 412);
  ASSERT_EQ(plan.batch.size(), 1u);
  EXPECT_EQ(plan.batch[0].chunk, 412);
}

}  // namespace
}  // namespace scd::consumer
