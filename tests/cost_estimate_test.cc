#include "base/cost_estimate.h"

#include <cmath>

#include "gtest/gtest.h"

namespace scd {
namespace {

TEST(CostEstimateTest, NothingObservedPredictsNothing) {
  CostEstimate estimate;
  EXPECT_FALSE(estimate.known());
  EXPECT_EQ(estimate.At(100), 0);
}

TEST(CostEstimateTest, RecoversALineExactly) {
  CostEstimate estimate;
  for (double n : {10.0, 50.0, 20.0, 200.0, 80.0}) estimate.Add(n, 300 + 4.5 * n);
  EXPECT_NEAR(estimate.fixed(), 300, 1e-9);
  EXPECT_NEAR(estimate.per_unit(), 4.5, 1e-12);
  EXPECT_NEAR(estimate.At(1000), 4800, 1e-8);
}

TEST(CostEstimateTest, OneSizeGivesTheMeanCostPerUnit) {
  CostEstimate estimate;
  estimate.Add(100, 900);
  estimate.Add(100, 1100);
  EXPECT_EQ(estimate.fixed(), 0);
  EXPECT_DOUBLE_EQ(estimate.per_unit(), 10);
}

TEST(CostEstimateTest, OldObservationsLeaveTheWindow) {
  CostEstimate estimate(4);
  for (double n : {10.0, 20.0, 30.0, 40.0}) estimate.Add(n, 2 * n);  // a fast node
  for (double n : {10.0, 20.0, 30.0, 40.0}) estimate.Add(n, 8 * n);  // it slowed down 4x
  EXPECT_EQ(estimate.samples(), 4u);
  EXPECT_NEAR(estimate.per_unit(), 8, 1e-12);
  EXPECT_NEAR(estimate.fixed(), 0, 1e-9);
}

TEST(CostEstimateTest, SlowOutliersDoNotMoveTheTypicalPass) {
  CostEstimate estimate;
  for (int i = 0; i < 10; ++i) estimate.Add(100, 1000 + (i % 2 ? 10 : -10));  // 10 us/token
  estimate.Add(100, 5000);  // two passes that met a busy core
  estimate.Add(100, 7000);
  EXPECT_NEAR(estimate.per_unit(), 10, 1e-9);
  CostEstimate line;  // an exact line stays exact
  for (double n : {10.0, 20.0, 30.0, 40.0, 50.0, 60.0}) line.Add(n, 7 + 3 * n);
  EXPECT_NEAR(line.per_unit(), 3, 1e-12);
  EXPECT_NEAR(line.fixed(), 7, 1e-9);
}

TEST(CostEstimateTest, TermsStayNonNegative) {
  CostEstimate falling;  // cost falling with size: a constant, not a negative slope
  falling.Add(10, 100);
  falling.Add(20, 90);
  EXPECT_EQ(falling.per_unit(), 0);
  EXPECT_DOUBLE_EQ(falling.fixed(), 95);
  CostEstimate steep;  // a line through (10, 0) and (20, 100): intercept -100 -> through 0
  steep.Add(10, 0);
  steep.Add(20, 100);
  EXPECT_EQ(steep.fixed(), 0);
  EXPECT_DOUBLE_EQ(steep.per_unit(), 2000.0 / 500.0);  // sum(n c) / sum(n^2)
}

TEST(CostEstimateTest, IgnoresObservationsThatCannotBeCosts) {
  CostEstimate estimate;
  estimate.Add(0, 5);
  estimate.Add(-3, 5);
  estimate.Add(10, -1);
  estimate.Add(10, NAN);
  estimate.Add(INFINITY, 1);
  EXPECT_FALSE(estimate.known());
}

}  // namespace
}  // namespace scd
