#include "base/cost_estimate.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace scd {

void CostEstimate::Add(double n, double cost) {
  if (!(n > 0) || !(cost >= 0) || !std::isfinite(n) || !std::isfinite(cost)) return;
  points_.emplace_back(n, cost);
  while (points_.size() > window_) points_.pop_front();
  Refit();
}

void CostEstimate::Refit() {
  Fit(points_);
  if (points_.size() < 5) return;
  // Noise only adds time (a busy core, a page fault): drop what lies far above the line, by
  // more than 3x the median absolute residual, and fit the rest once more.
  std::vector<double> residuals;
  for (const auto& [n, cost] : points_) residuals.push_back(std::abs(cost - At(n)));
  std::nth_element(residuals.begin(), residuals.begin() + residuals.size() / 2, residuals.end());
  double scale = 0;
  for (const auto& point : points_) scale = std::max(scale, point.second);
  const double limit = 3 * residuals[residuals.size() / 2] + 1e-9 * scale;
  std::deque<std::pair<double, double>> kept;
  for (const auto& [n, cost] : points_) {
    if (cost - At(n) <= limit) kept.emplace_back(n, cost);
  }
  if (kept.size() < points_.size() && !kept.empty()) Fit(kept);
}

void CostEstimate::Fit(const std::deque<std::pair<double, double>>& points) {
  const double count = static_cast<double>(points.size());
  double sn = 0, sc = 0;
  for (const auto& [n, cost] : points) {
    sn += n;
    sc += cost;
  }
  const double mean_n = sn / count, mean_c = sc / count;
  double snn = 0, snc = 0;
  for (const auto& [n, cost] : points) {
    snn += (n - mean_n) * (n - mean_n);
    snc += (n - mean_n) * (cost - mean_c);
  }
  // Sizes too alike to separate the terms (relative spread under 1e-6): the mean cost per unit.
  if (snn <= 1e-12 * mean_n * mean_n * count) {
    fixed_ = 0;
    per_unit_ = mean_c / mean_n;
    return;
  }
  per_unit_ = snc / snn;
  fixed_ = mean_c - per_unit_ * mean_n;
  if (fixed_ < 0 || per_unit_ < 0) {
    if (per_unit_ < 0) {  // cost falls with size: noise around a constant
      per_unit_ = 0;
      fixed_ = mean_c;
      return;
    }
    // Through the origin: the least-squares slope of cost = per_unit * n.
    double sq = 0, cross = 0;
    for (const auto& [n, cost] : points) {
      sq += n * n;
      cross += n * cost;
    }
    fixed_ = 0;
    per_unit_ = cross / sq;
  }
}

}  // namespace scd
