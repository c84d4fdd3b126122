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

}  // namespace
}  // namespace scd
