// The takeover policy (coordinator/producer_takeover.h) on hand-made speeds, against the TTFT
// model worked by hand: a prompt of 100 tokens, the producer's prefill 100 us/token (10 ms), the
// consumer's own 200 us/token (20 ms), no rebuild or first decode measured. The rest of a transfer
// then costs max(10 ms, bytes left / goodput) and the fallback 20 ms: a fast link takes the
// transfer over, a slow one with most layers left falls back, and the same slow link with few
// layers left takes it over -- where that is cheaper depends on the layers already rebuilt. A
// request that forbids the fallback always takes it; nothing measured takes it as routed.
#include "coordinator/producer_takeover.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace scd::coordinator {
namespace {

using ::testing::HasSubstr;

v1::LinearCost PerToken(double us) {
  v1::LinearCost cost;
  cost.set_per_unit_us(us);
  cost.set_samples(8);
  return cost;
}

AutoInputs Measured(double goodput_bytes_per_s) {
  AutoInputs in;
  in.prompt_tokens = 100;
  *in.producer.mutable_prefill() = PerToken(100);
  *in.consumer.mutable_prefill() = PerToken(200);
  in.goodput_bytes_per_s = goodput_bytes_per_s;
  return in;
}

v1::TransferLost Lost(uint32_t rebuilt, uint64_t bytes_left) {
  v1::TransferLost lost;
  lost.set_layers_rebuilt(rebuilt);
  lost.set_layers(8);
  lost.set_bytes_left(bytes_left);
  lost.set_bytes_total(200000);
  lost.set_prompt_tokens(100);
  return lost;
}

TEST(ProducerTakeoverTest, AFastLinkTakesTheTransferOver) {
  const TakeoverDecision d = ChooseTakeover(Measured(0), Lost(2, 150000), true);
  EXPECT_TRUE(d.take_over) << d.reason;
  EXPECT_NEAR(d.rest.total_us, 10000, 1);   // the second producer's whole prefill
  EXPECT_NEAR(d.local.total_us, 20000, 1);  // the consumer's own prefill
  EXPECT_THAT(d.reason, HasSubstr("layers 2-7 (150000 bytes) from another producer"));
}

TEST(ProducerTakeoverTest, ASlowLinkWithMostLayersLeftFallsBack) {
  // 1 MB/s: 100 kB left take 100 ms, the consumer's prefill 20 ms.
  const TakeoverDecision d = ChooseTakeover(Measured(1e6), Lost(1, 100000), true);
  EXPECT_FALSE(d.take_over) << d.reason;
  EXPECT_NEAR(d.rest.total_us, 100000, 1);
  EXPECT_NEAR(d.local.total_us, 20000, 1);
}

TEST(ProducerTakeoverTest, TheSameLinkWithFewLayersLeftTakesItOver) {
  // 1 MB/s: 15 kB left take 15 ms, within the consumer's 20 ms.
  const TakeoverDecision d = ChooseTakeover(Measured(1e6), Lost(7, 15000), true);
  EXPECT_TRUE(d.take_over) << d.reason;
  EXPECT_NEAR(d.rest.total_us, 15000, 1);
}

TEST(ProducerTakeoverTest, ARequestThatForbidsTheFallbackAlwaysTakesItOver) {
  const TakeoverDecision d = ChooseTakeover(Measured(1e6), Lost(1, 100000), false);
  EXPECT_TRUE(d.take_over);
  EXPECT_THAT(d.reason, HasSubstr("forbids the fallback"));
}

TEST(ProducerTakeoverTest, NothingMeasuredTakesItOverAsRouted) {
  AutoInputs in;
  in.prompt_tokens = 100;
  const TakeoverDecision d = ChooseTakeover(in, Lost(3, 50000), true);
  EXPECT_TRUE(d.take_over);
  EXPECT_THAT(d.reason, HasSubstr("no speeds measured"));
}

}  // namespace
}  // namespace scd::coordinator
