// ServingMetrics (serving/serving_metrics.h) from the events a node writes, read back from the
// registry's text exposition: a Finished that reports a continuation check counts its received
// ids as agreed and parted; a Finished without one counts none.
#include "serving/serving_metrics.h"

#include <gtest/gtest.h>

#include <string>

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

}  // namespace
}  // namespace scd
