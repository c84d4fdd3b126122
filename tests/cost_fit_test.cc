// FitNonNegative (bench/cost_fit.h) against costs made from known coefficients: recovered
// exactly, a negative one held at 0 with the rest refitted (the constrained optimum, found here
// by a grid search), and inputs it refuses.
#include "bench/cost_fit.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace scd::bench {
namespace {

// Rows of a prefill-like model: 1, n, n * context.
std::vector<std::vector<double>> PrefillRows() {
  std::vector<std::vector<double>> rows;
  for (double n : {16.0, 64.0, 200.0, 450.0}) {
    for (double context : {0.0, 100.0, 900.0}) rows.push_back({1.0, n, n * (context + n / 2)});
  }
  return rows;
}

std::vector<double> Costs(const std::vector<std::vector<double>>& rows,
                          const std::vector<double>& c) {
  std::vector<double> y;
  for (const auto& row : rows) {
    double v = 0;
    for (size_t j = 0; j < c.size(); ++j) v += c[j] * row[j];
    y.push_back(v);
  }
  return y;
}

TEST(CostFitTest, RecoversExactCoefficientsOfTermsOfVeryDifferentSizes) {
  const std::vector<double> truth = {350.0, 12.5, 0.004};
  const auto rows = PrefillRows();
  CostFit fit = FitNonNegative(rows, Costs(rows, truth)).value();
  ASSERT_EQ(fit.coefficients.size(), 3u);
  for (size_t j = 0; j < 3; ++j) EXPECT_NEAR(fit.coefficients[j], truth[j], 1e-9 * truth[j]);
  EXPECT_LT(fit.rms_residual, 1e-9 * fit.rms_cost);
  EXPECT_LT(fit.rms_relative_residual, 1e-9);
}

TEST(CostFitTest, AZeroTermComesOutZeroNotASmallNegative) {
  const auto rows = PrefillRows();
  CostFit fit = FitNonNegative(rows, Costs(rows, {0.0, 8.0, 0.0})).value();
  EXPECT_EQ(fit.coefficients[0], 0.0);
  EXPECT_NEAR(fit.coefficients[1], 8.0, 1e-9);
  EXPECT_EQ(fit.coefficients[2], 0.0);
}

TEST(CostFitTest, ANegativeTermIsHeldAtZeroAndTheRestIsTheConstrainedOptimum) {
  // Costs with a negative intercept: the unconstrained fit is (-500, 10); the best with the
  // intercept >= 0 sets it to 0 and fits the slope through the origin, each residual relative to
  // its cost (weight w = 1 / y): sum(w^2 x y) / sum(w^2 x^2).
  std::vector<std::vector<double>> rows;
  std::vector<double> y;
  for (double n : {100.0, 200.0, 300.0, 400.0}) {
    rows.push_back({1.0, n});
    y.push_back(-500.0 + 10.0 * n);
  }
  CostFit fit = FitNonNegative(rows, y).value();
  double xy = 0, xx = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const double w2 = 1 / (y[i] * y[i]);
    xy += w2 * rows[i][1] * y[i];
    xx += w2 * rows[i][1] * rows[i][1];
  }
  EXPECT_EQ(fit.coefficients[0], 0.0);
  EXPECT_NEAR(fit.coefficients[1], xy / xx, 1e-9);
  // No point of a grid over the feasible set does better.
  auto residual = [&](double a, double b) {
    double s = 0;
    for (size_t i = 0; i < rows.size(); ++i) s += std::pow((y[i] - a - b * rows[i][1]) / y[i], 2);
    return s;
  };
  const double found = residual(fit.coefficients[0], fit.coefficients[1]);
  for (double a = 0; a <= 1000; a += 10) {
    for (double b = 5; b <= 15; b += 0.01) EXPECT_GE(residual(a, b), found - 1e-12);
  }
}

TEST(CostFitTest, NoiseLeavesTheFitNearTheTruth) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> jitter(0.95, 1.05);
  const std::vector<double> truth = {200.0, 9.0, 0.002};
  const auto rows = PrefillRows();
  std::vector<double> y = Costs(rows, truth);
  for (double& v : y) v *= jitter(rng);
  CostFit fit = FitNonNegative(rows, y).value();
  // Up to 5 % noise on every cost, averaged by the fit: its predictions stay within 5 % of the
  // noiseless costs (a coefficient alone may trade against a correlated one).
  const std::vector<double> exact = Costs(rows, truth);
  const std::vector<double> predicted = Costs(rows, fit.coefficients);
  for (size_t i = 0; i < rows.size(); ++i) EXPECT_NEAR(predicted[i], exact[i], 0.05 * exact[i]);
  EXPECT_LT(fit.rms_relative_residual, 0.05);
}

TEST(CostFitTest, ATermNoRowHasIsZeroAndTwoTermsThatMoveTogetherKeepOne) {
  std::vector<std::vector<double>> rows;
  for (double n : {1.0, 2.0, 3.0}) rows.push_back({n, 0.0, 2 * n});
  CostFit fit = FitNonNegative(rows, {3.0, 6.0, 9.0}).value();
  EXPECT_EQ(fit.coefficients[1], 0.0);
  EXPECT_NEAR(fit.coefficients[0] + 2 * fit.coefficients[2], 3.0, 1e-9);
  EXPECT_TRUE(fit.coefficients[0] == 0.0 || fit.coefficients[2] == 0.0) << "one of the pair";
}

TEST(CostFitTest, RefusesWhatItCannotFit) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_FALSE(FitNonNegative({}, {}).ok());
  EXPECT_FALSE(FitNonNegative({{1.0, 2.0}}, {3.0}).ok()) << "fewer rows than terms";
  EXPECT_FALSE(FitNonNegative({{1.0}, {1.0, 2.0}}, {1.0, 2.0}).ok()) << "ragged";
  EXPECT_FALSE(FitNonNegative({{1.0}, {2.0}}, {1.0}).ok()) << "rows against costs";
  EXPECT_FALSE(FitNonNegative({{1.0}, {nan}}, {1.0, 2.0}).ok());
  EXPECT_FALSE(FitNonNegative({{1.0}, {2.0}}, {1.0, nan}).ok());
  EXPECT_FALSE(
      FitNonNegative(
          {{1, 2, 3, 4, 5}, {1, 2, 3, 4, 5}, {1, 2, 3, 4, 5}, {1, 2, 3, 4, 5}, {1, 2, 3, 4, 5}},
          {1, 2, 3, 4, 5})
          .ok())
      << "more terms than kMaxFitTerms";
  CostFit zero = FitNonNegative({{0.0}, {0.0}}, {0.0, 0.0}).value();
  EXPECT_EQ(zero.coefficients[0], 0.0);
}

}  // namespace
}  // namespace scd::bench
