// ServingMetrics (serving/serving_metrics.h) from the events a node writes, read back from the
// registry's text exposition: a Finished that reports a continuation check counts its received
// ids as agreed and parted; a Finished without one counts none; a target Started in a transfer
// mode that Finished local counts as a fallback, one that ran as begun does not.
#include "serving/serving_metrics.h"

#include <gtest/gtest.h>

#include <string>

#include "proto/wire_mode.h"

namespace scd {
namespace {

v1::GenerateEvent FinishedEvent(bool checked) {
  v1::GenerateEvent e;
  e.set_target("fables");
  v1::Finished& f = *e.mutable_finished();
  f.set_reason("length");
  f.set_output_tokens(9);
  if (checked) {
    f.mutable_continuation()->set_checked(5);
    f.mutable_continuation()->set_parted(2);
  }
  return e;
}

TEST(ServingMetricsTest, AContinuationCheckCountsItsIdsAgreedAndParted) {
  MetricsRegistry registry;
  ServingMetrics metrics(&registry);
  {
    ServingMetrics::Call call(&metrics);
    call.Observe(FinishedEvent(/*checked=*/false));
  }
  EXPECT_EQ(registry.Render().find("scd:continued_tokens_checked_total"), std::string::npos);
  {
    ServingMetrics::Call call(&metrics);
    call.Observe(FinishedEvent(/*checked=*/true));
  }
  const std::string text = registry.Render();
  EXPECT_NE(text.find("scd:continued_tokens_checked_total{result=\"agreed\"} 3"), std::string::npos)
      << text;
  EXPECT_NE(text.find("scd:continued_tokens_checked_total{result=\"parted\"} 2"), std::string::npos)
      << text;
}

// One target's Started (in `begun`) and Finished (ran `ran`).
void StartAndFinish(ServingMetrics* metrics, TransferMode begun, TransferMode ran) {
  ServingMetrics::Call call(metrics);
  v1::GenerateEvent started;
  started.set_target("fables");
  SetRanMode(begun, started.mutable_started());
  call.Observe(started);
  v1::GenerateEvent finished = FinishedEvent(/*checked=*/false);
  SetRanMode(ran, finished.mutable_finished());
  call.Observe(finished);
}

TEST(ServingMetricsTest, ATransferThatRanLocalCountsAsAFallbackOfTheModeBegun) {
  MetricsRegistry registry;
  ServingMetrics metrics(&registry);
  // Every transfer mode's series exists from the start, at 0 (alert rules and panels see it).
  EXPECT_NE(registry.Render().find("scd:transfer_fallbacks_total{mode=\"scd\"} 0"),
            std::string::npos);
  StartAndFinish(&metrics, TransferMode::kScd, TransferMode::kScd);
  StartAndFinish(&metrics, TransferMode::kLocal, TransferMode::kLocal);
  StartAndFinish(&metrics, TransferMode::kScd, TransferMode::kLocal);
  StartAndFinish(&metrics, TransferMode::kRaw, TransferMode::kLocal);
  StartAndFinish(&metrics, TransferMode::kRaw, TransferMode::kLocal);
  const std::string text = registry.Render();
  EXPECT_NE(text.find("scd:transfer_fallbacks_total{mode=\"scd\"} 1"), std::string::npos) << text;
  EXPECT_NE(text.find("scd:transfer_fallbacks_total{mode=\"raw\"} 2"), std::string::npos) << text;
  EXPECT_NE(text.find("scd:transfer_fallbacks_total{mode=\"int4\"} 0"), std::string::npos) << text;
  EXPECT_EQ(text.find("scd:transfer_fallbacks_total{mode=\"local\"}"), std::string::npos) << text;
}

}  // namespace
}  // namespace scd
