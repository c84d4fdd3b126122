#include "codec/ttft_model.h"

#include <cmath>

#include "gtest/gtest.h"

namespace scd {
namespace {

TEST(TtftModelTest, LocalIsQueuePrefillAndDecode) {
  TtftInputs local;
  local.queue_us = 100;
  local.prefill_us = 5000;
  local.decode_us = 300;
  local.payload_bytes = 1e9;  // ignored: nothing crosses the link
  local.goodput_bytes_per_s = 1;
  const TtftPrediction p = PredictTtft(local);
  EXPECT_DOUBLE_EQ(p.total_us, 5400);
  EXPECT_EQ(p.transfer_us, 0);
  EXPECT_EQ(p.bound_by, TtftStage::kPrefill);
}

TEST(TtftModelTest, TransferTimeIsBytesPastTheBurstOverGoodputPlusLatency) {
  // 1 MB over 1 Gbit/s (125 MB/s) = 8 ms; 64 KiB pass in the burst.
  EXPECT_DOUBLE_EQ(TransferUs(1e6, 0, 125e6, 0), 8000);
  EXPECT_DOUBLE_EQ(TransferUs(1e6 + 65536, 65536, 125e6, 50), 8050);
  EXPECT_DOUBLE_EQ(TransferUs(1000, 65536, 125e6, 50), 50);  // all within the burst
  EXPECT_DOUBLE_EQ(TransferUs(1e6, 0, 0, 20), 20);           // unshaped: latency only
  EXPECT_DOUBLE_EQ(TransferUs(1e6, 0, INFINITY, 0), 0);
}

TEST(TtftModelTest, TheSlowestOverlappedStageHoldsTheFirstToken) {
  TtftInputs t;
  t.transfer = true;
  t.queue_us = 10;
  t.prefill_us = 4000;
  t.payload_bytes = 125e3;  // 1 ms at 125 MB/s
  t.goodput_bytes_per_s = 125e6;
  t.rebuild_us = 2000;
  t.last_rebuild_us = 100;
  t.decode_us = 200;
  TtftPrediction p = PredictTtft(t);  // the prefill hides the link and the rebuild
  EXPECT_DOUBLE_EQ(p.total_us, 10 + 4000 + 200);
  EXPECT_EQ(p.bound_by, TtftStage::kPrefill);
  EXPECT_DOUBLE_EQ(p.transfer_us, 1000);

  t.goodput_bytes_per_s = 12.5e6;  // 10 ms on the link, then the last chunk's rebuild
  p = PredictTtft(t);
  EXPECT_DOUBLE_EQ(p.total_us, 10 + 10000 + 100 + 200);
  EXPECT_EQ(p.bound_by, TtftStage::kLink);

  t.goodput_bytes_per_s = 0;  // unlimited link, a rebuild slower than the prefill
  t.rebuild_us = 9000;
  p = PredictTtft(t);
  EXPECT_DOUBLE_EQ(p.total_us, 10 + 9000 + 200);
  EXPECT_EQ(p.bound_by, TtftStage::kRebuild);
  EXPECT_STREQ(TtftStageName(p.bound_by), "rebuild");
}

TEST(TtftModelTest, LateDearLayersHoldTheFirstTokenPastThePrefill) {
  // Six layers, the producer has layer l's codes out at 1 ms per layer; the consumer rebuilds a
  // layer in 0.2 ms, but layers 3 and 4 (patch layers) take 1.5 ms each. In aggregate the rebuild
  // (0.2 * 4 + 3.0 = 3.8 ms) hides behind the 6 ms prefill; in order it cannot: layer 3's codes
  // exist at 4 ms, and 1.5 + 1.5 + 0.2 ms of rebuild follow them one after another.
  TtftInputs t;
  t.transfer = true;
  t.prefill_us = 6000;
  t.rebuild_us = 3800;
  t.last_rebuild_us = 200;
  t.decode_us = 300;
  t.latency_us = 50;
  EXPECT_DOUBLE_EQ(PipelineUs(t), 0);  // no per-layer times: no term
  EXPECT_DOUBLE_EQ(PredictTtft(t).total_us, 6000 + 300);
  t.layer_codes_us = {1000, 2000, 3000, 4000, 5000, 6000};
  t.layer_rebuild_us = {200, 200, 200, 1500, 1500, 200};
  // max over l of codes(l) + latency + the rebuilds from l on: l = 3 gives 4000 + 50 + 3200.
  EXPECT_DOUBLE_EQ(PipelineUs(t), 7250);
  const TtftPrediction p = PredictTtft(t);
  EXPECT_DOUBLE_EQ(p.total_us, 7250 + 300);
  EXPECT_EQ(p.bound_by, TtftStage::kRebuild);
  // Cheap layers at the end: the last layer's codes plus its rebuild is the term (the prefill's
  // end plus what no streaming hides), above the prefill alone.
  t.layer_rebuild_us = {1500, 1500, 200, 200, 200, 200};
  EXPECT_DOUBLE_EQ(PipelineUs(t), 6250);
  // Fewer rebuild entries than layers (a layer no chunk rebuilt): those count as none, and the
  // last layer's codes still have to arrive.
  t.layer_rebuild_us = {200, 200, 200, 1500};
  EXPECT_DOUBLE_EQ(PipelineUs(t), 6000 + 50);
  t.layer_rebuild_us = {200, 200, 200, 3500};
  EXPECT_DOUBLE_EQ(PipelineUs(t), 4000 + 50 + 3500);
}

}  // namespace
}  // namespace scd
