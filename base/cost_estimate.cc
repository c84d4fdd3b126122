#include "base/cost_estimate.h"

#include <cmath>

namespace scd {

void CostEstimate::Add(double n, double cost) {
  if (!(n > 0) || !(cost >= 0) || !std::isfinite(n) || !std::isfinite(cost)) return;
  points_.emplace_back(n, cost);
  while (points_.size() > window_) points_.pop_front();
  Refit();
}

void CostEstimate::Refit() {
  const double count = static_cast<double>(points_.size());
  double sn = 0, sc = 0;
  for (const auto& [n, cost] : points_) {
    sn += n;
    sc += cost;
  }
  const double mean_n = sn / count, mean_c = sc / count;
  double snn = 0, snc = 0;
  for (const auto& [n, cost] : points_) {
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
    for (const auto& [n, cost] : points_) {
      sq += n * n;
      cross += n * cost;
    }
    fixed_ = 0;
    per_unit_ = cross / sq;
  }
}

}  // namespace scd
