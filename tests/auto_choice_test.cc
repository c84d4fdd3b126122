// Auto mode's cost model against hand-computed predictions: the link as its transfers showed it,
// each candidate's predicted TTFT from the nodes' speeds, and the choice within a quality budget
// or under a TTFT objective.
#include "coordinator/auto_choice.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "proto/wire_mode.h"

namespace scd::coordinator {
namespace {

using ::testing::HasSubstr;

void SetCost(v1::LinearCost* cost, double fixed, double per_unit) {
  cost->set_fixed_us(fixed);
  cost->set_per_unit_us(per_unit);
  cost->set_samples(8);
}

v1::Finished Transfer(uint64_t bytes, uint64_t transfer_us, uint64_t prefill_us) {
  v1::Finished f;
  SetRanMode(*ParseTransferMode("scd"), &f);
  f.set_payload_bytes(bytes);
  f.mutable_timings()->set_transfer(transfer_us);
  f.mutable_timings()->set_prefill(prefill_us);
  return f;
}

TEST(LinkEstimateTest, LearnsOnlyFromTransfersTheLinkHeldBack) {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  LinkEstimate link;
  // Finished with the prefill: the link hid behind it, nothing learned of its speed.
  link.Observe(Transfer(1'000'000, 10'000, 9'500), t0);
  EXPECT_FALSE(link.Known(t0));
  // Held back: 100 us latency + bytes at 10 MB/s (0.1 us per byte).
  link.Observe(Transfer(1'000'000, 100'100, 9'500), t0);
  link.Observe(Transfer(2'000'000, 200'100, 9'500), t0);
  ASSERT_TRUE(link.Known(t0));
  EXPECT_NEAR(link.goodput_bytes_per_s(), 10e6, 1);
  EXPECT_NEAR(link.latency_us(), 100, 1e-6);
  // A local request teaches nothing.
  v1::Finished local = Transfer(0, 0, 5000);
  SetRanMode(*ParseTransferMode("local"), &local);
  link.Observe(local, t0);
  EXPECT_TRUE(link.Known(t0));
  // Forgotten after a minute without a held-back transfer.
  EXPECT_FALSE(link.Known(t0 + absl::Seconds(61)));
}

TEST(LinkEstimateTest, ATransferFasterThanTheEstimateDropsIt) {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  LinkEstimate link;
  link.Observe(Transfer(1'000'000, 100'000, 10'000), t0);  // 10 MB/s
  ASSERT_TRUE(link.Known(t0));
  // 1 MB in 20 ms, within the prefill's pace (not held back) but 5x faster than 10 MB/s allows.
  link.Observe(Transfer(1'000'000, 20'000, 19'000), t0);
  EXPECT_FALSE(link.Known(t0));
}

// Producer and consumer at 100 us + 10 us/token prefill, consumer rebuild 2 us/token, first
// decode 500 us; 64-token prompt, nothing cached.
AutoInputs Inputs(double goodput) {
  AutoInputs in;
  in.prompt_tokens = 64;
  SetCost(in.producer.mutable_prefill(), 100, 10);
  SetCost(in.consumer.mutable_prefill(), 100, 10);
  SetCost(in.consumer.mutable_rebuild(), 0, 2);
  SetCost(in.consumer.mutable_first_decode(), 500, 0);
  in.goodput_bytes_per_s = goodput;
  in.layers = 2;
  in.link = "test";
  return in;
}

TEST(AutoChoiceTest, PredictionsFollowTheTtftModel) {
  AutoInputs in = Inputs(1e6);  // 1 MB/s
  EXPECT_FALSE(CanPredict(AutoInputs{}));
  ASSERT_TRUE(CanPredict(in));
  EXPECT_DOUBLE_EQ(PredictLocal(in).total_us, 100 + 640);
  // 63 prefix tokens at 100 B/token: 6.3 ms on the link, then half the 126 us rebuild; + decode.
  const TtftPrediction t = PredictTransfer(in, 100, 0, true);
  EXPECT_DOUBLE_EQ(t.total_us, 6300 + 63 + 500);
  EXPECT_EQ(t.bound_by, TtftStage::kLink);
  // Cached prompt positions: the consumer's shorten the transfer and its own prefill, the
  // producer's its prefill; the producer's queue waits its passes.
  in.consumer_cached_tokens = 32;
  in.producer_cached_tokens = 48;
  in.producer_queue = 2;
  in.goodput_bytes_per_s = 0;  // unlimited
  EXPECT_DOUBLE_EQ(PredictLocal(in).total_us, 100 + 320);
  EXPECT_DOUBLE_EQ(PredictTransfer(in, 100, 0, true).total_us, 3 * (100 + 160) + 500);
  // A prefill speed only one node measured is taken for the other.
  AutoInputs one = Inputs(0);
  one.consumer.clear_prefill();
  EXPECT_DOUBLE_EQ(PredictLocal(one).total_us, 740);
}

Frontier ThreePoints() {
  Frontier f;
  auto add = [&](WireDtype dtype, int64_t rank, double bytes, double kl) {
    FrontierPoint& p = f.points.emplace_back();
    p.code_dtype = dtype;
    p.rank_k = p.rank_v = {rank, rank};
    p.rank_h = {0, 0};
    p.bytes_per_token = bytes;
    p.kl = kl;
  };
  add(WireDtype::kInt4, 2, 10, 0.05);
  add(WireDtype::kInt8, 4, 40, 0.02);
  add(WireDtype::kF16, 8, 100, 0.018);
  f.recommended = 1;
  return f;
}

TEST(AutoChoiceTest, ASlowLinkAndAShortPromptPrefillLocally) {
  const Frontier f = ThreePoints();
  const std::vector<AutoCandidate> c = AutoCandidates(Inputs(10e3), &f, 0);  // 10 kB/s
  ASSERT_EQ(c.size(), 4u);
  const AutoChoice choice = ChooseAuto(c, 0.02, "max_kl 0.02", 0);
  EXPECT_EQ(c[choice.chosen].mode, TransferMode::kLocal);
  // The cheapest point within the budget is the runner-up: 63 x 40 B over 10 kB/s = 252 ms.
  ASSERT_TRUE(choice.runner_up.has_value());
  EXPECT_EQ(c[*choice.runner_up].kl, 0.02);
  EXPECT_THAT(choice.reason, HasSubstr("auto: local prefill predicted 0.7 ms (prefill-bound)"));
  EXPECT_THAT(choice.reason, HasSubstr("the fastest predicted within max_kl 0.02"));
  EXPECT_THAT(choice.reason, HasSubstr("runner-up scd point #1 int8"));
  EXPECT_THAT(choice.reason, HasSubstr("252.6 ms (link-bound)"));
}

TEST(AutoChoiceTest, AFastLinkSendsTheFastestPointWithinTheBudget) {
  const Frontier f = ThreePoints();
  AutoInputs in = Inputs(0);
  SetCost(in.consumer.mutable_prefill(), 100, 50);  // a consumer 5x slower than its producer
  const std::vector<AutoCandidate> c = AutoCandidates(in, &f, 0);
  AutoChoice choice = ChooseAuto(c, 0.02, "max_kl 0.02", 0);
  // Every point is as fast on an unlimited link: the best quality among equals (f16, KL 0.018).
  EXPECT_EQ(c[choice.chosen].mode, TransferMode::kScd);
  EXPECT_EQ(c[choice.chosen].point->code_dtype, WireDtype::kF16);
  // At 1 MB/s bytes matter: int8 (2.5 ms on the link) beats f16 (6.3 ms); int4 is over budget.
  in.goodput_bytes_per_s = 1e6;
  const std::vector<AutoCandidate> slow = AutoCandidates(in, &f, 0);
  ASSERT_EQ(slow[ChooseAuto(slow, 0.02, "max_kl 0.02", 0).chosen].mode, TransferMode::kScd);
  choice = ChooseAuto(slow, 0.02, "max_kl 0.02", 0);
  EXPECT_EQ(slow[choice.chosen].point->code_dtype, WireDtype::kInt8);
  choice = ChooseAuto(slow, 0.06, "max_kl 0.06", 0);
  EXPECT_EQ(slow[choice.chosen].point->code_dtype, WireDtype::kInt4);
}

TEST(AutoChoiceTest, ABusyBatchWeighsTheItlAChoicesPromptWorkCostsIt) {
  const Frontier f = ThreePoints();
  AutoInputs in = Inputs(0);  // unlimited link: local 740 us, a point 740 + 500 us
  in.consumer_decoding = 4;
  // Nothing measured of the ITL cost yet: the TTFTs alone decide, local.
  std::vector<AutoCandidate> c = AutoCandidates(in, &f, 0);
  EXPECT_EQ(c[ChooseAuto(c, 0.02, "max_kl 0.02", 0).chosen].mode, TransferMode::kLocal);
  EXPECT_EQ(c[0].batch_us, 0);
  // Measured: a local prefill's chunks cost each decoding sequence 5 us per prompt token, a
  // rebuild 0.5 us. Local: 740 us + 4 x 64 x 5 = 2,020 us of delay; a point: 1,240 us +
  // 4 x 63 x 0.5 = 1,366 us. The codes win.
  SetCost(in.consumer.mutable_local_itl(), 0, 5);
  SetCost(in.consumer.mutable_rebuild_itl(), 0, 0.5);
  c = AutoCandidates(in, &f, 0);
  EXPECT_DOUBLE_EQ(c[0].batch_us, 1280);
  EXPECT_DOUBLE_EQ(c[1].batch_us, 126);
  EXPECT_DOUBLE_EQ(c[0].cost_us(), 740 + 1280);
  EXPECT_DOUBLE_EQ(c[1].cost_us(), c[1].predicted.total_us + 126);
  EXPECT_DOUBLE_EQ(c[1].predicted.total_us, 1240);
  AutoChoice choice = ChooseAuto(c, 0.02, "max_kl 0.02", 0);
  EXPECT_EQ(c[choice.chosen].mode, TransferMode::kScd);
  EXPECT_THAT(choice.reason, HasSubstr("+ 0.1 ms of the batch's ITL"));
  EXPECT_THAT(choice.reason, HasSubstr("the least delay predicted (its TTFT and the decoding "
                                       "sequences' ITL) within max_kl 0.02"));
  // Within KL 0.05 the int4 point is as fast; without it, local is the runner-up.
  const std::vector<AutoCandidate> two = {c[0], c[2]};
  choice = ChooseAuto(two, 0.02, "max_kl 0.02", 0);
  EXPECT_EQ(two[choice.chosen].mode, TransferMode::kScd);
  EXPECT_THAT(choice.reason, HasSubstr("runner-up local prefill predicted 0.7 ms (prefill-bound) "
                                       "+ 1.3 ms of the batch's ITL"));
  // No sequence decoding: nothing to slow, local again.
  in.consumer_decoding = 0;
  c = AutoCandidates(in, &f, 0);
  EXPECT_EQ(c[ChooseAuto(c, 0.02, "max_kl 0.02", 0).chosen].mode, TransferMode::kLocal);
  // A local prefill beside decodes measured at 30 us per token (it moves in their slack): 64 x
  // 30 = 1,920 us, not the 740 us it takes alone; alone again when nothing decodes.
  SetCost(in.consumer.mutable_busy_prefill(), 0, 30);
  EXPECT_DOUBLE_EQ(PredictLocal(in).total_us, 740);
  in.consumer_decoding = 1;
  EXPECT_DOUBLE_EQ(PredictLocal(in).total_us, 1920);
}

TEST(AutoChoiceTest, ATtftObjectiveTakesTheBestQualityThatMeetsIt) {
  const Frontier f = ThreePoints();
  AutoInputs in = Inputs(1e6);
  SetCost(in.consumer.mutable_prefill(), 100, 500);  // local: 32.1 ms
  const std::vector<AutoCandidate> c = AutoCandidates(in, &f, 0);
  // int4 1.2 ms, int8 3.1 ms, f16 6.9 ms (link + last rebuild + decode), local 32.1 ms.
  AutoChoice choice = ChooseAuto(c, 0.06, "max_kl 0.06", 5000);
  EXPECT_EQ(c[choice.chosen].point->code_dtype, WireDtype::kInt8);  // f16 misses 5 ms
  EXPECT_THAT(choice.reason, HasSubstr("the best quality predicted to meet ttft_slo_ms 5"));
  choice = ChooseAuto(c, 0.06, "max_kl 0.06", 40000);  // local (KL 0) meets 40 ms
  EXPECT_EQ(c[choice.chosen].mode, TransferMode::kLocal);
  choice = ChooseAuto(c, 0.06, "max_kl 0.06", 500);  // nothing meets 0.5 ms: the fastest
  EXPECT_EQ(c[choice.chosen].point->code_dtype, WireDtype::kInt4);
  EXPECT_THAT(choice.reason, HasSubstr("none is predicted to meet ttft_slo_ms 0.5"));
}

TEST(AutoChoiceTest, TheRulesChoiceStandsUnlessAnotherIsClearlyFaster) {
  std::vector<AutoCandidate> c(2);
  c[0].mode = TransferMode::kLocal;
  c[0].label = "local prefill";
  c[1].mode = TransferMode::kRaw;
  c[1].label = "the raw cache";
  c[0].predicted.total_us = 9500;
  c[1].predicted.total_us = 10000;  // 0.5 ms slower: under 1 ms, the raw cache stands
  AutoChoice choice = ChooseAuto(c, 0, "exact caches", 0, 1);
  EXPECT_EQ(choice.chosen, 1u);
  EXPECT_THAT(choice.reason, HasSubstr("kept: nothing within exact caches"));
  c[1].predicted.total_us = 30000;  // 1.0 ms faster but under 5 %: stands
  c[0].predicted.total_us = 29000;
  EXPECT_EQ(ChooseAuto(c, 0, "exact caches", 0, 1).chosen, 1u);
  c[0].predicted.total_us = 8000;  // 2 ms and 20 % faster: taken
  choice = ChooseAuto(c, 0, "exact caches", 0, 1);
  EXPECT_EQ(choice.chosen, 0u);
  EXPECT_EQ(choice.runner_up, 1u);
  // An objective decides by quality, whatever the rule would have chosen.
  c[1].kl = 0.5;
  EXPECT_EQ(ChooseAuto(c, 0, "exact caches", 9000, 1).chosen, 0u);
}

TEST(AutoChoiceTest, WithoutAFrontierTheRawCacheIsWeighed) {
  const std::vector<AutoCandidate> c = AutoCandidates(Inputs(0), nullptr, 1000);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[1].mode, TransferMode::kRaw);
  EXPECT_DOUBLE_EQ(c[1].predicted.total_us, 740 + 500);  // no rebuild, the first decode step
  EXPECT_EQ(c[ChooseAuto(c, 0, "exact caches", 0).chosen].mode, TransferMode::kLocal);
}

}  // namespace
}  // namespace scd::coordinator
