// CostEstimate: a moving estimate of a cost that grows linearly with the work's size,
//   cost(n) = fixed + per_unit * n,
// fitted by least squares over the last `window` observations (a prefill's microseconds against
// the tokens it computed; a transfer's against its bytes: fixed = latency, per_unit = 1 /
// goodput). Older observations fall out, so the estimate follows a node whose speed changes (a
// busier machine, a slower link) within `window` completed passes. With 5 or more observations,
// those far above the line (over 3x the median absolute residual: noise only adds time) are left
// out of a second fit, so the estimate follows the typical pass. With one distinct size seen
// the fit cannot separate the two terms: fixed is 0 and per_unit the mean cost per unit. Both
// terms are kept >= 0 (a negative intercept from noise becomes 0 with the slope refitted
// through the origin).
// Thread-safety: not thread-safe; the owner serialises access.
#ifndef SCD_BASE_COST_ESTIMATE_H_
#define SCD_BASE_COST_ESTIMATE_H_

#include <cstddef>
#include <deque>
#include <utility>

namespace scd {

class CostEstimate {
 public:
  explicit CostEstimate(size_t window = 32) : window_(window == 0 ? 1 : window) {}

  // Records one observation: `cost` for work of size `n`. Ignored unless n > 0 and cost >= 0
  // (both finite).
  void Add(double n, double cost);

  size_t samples() const { return points_.size(); }
  bool known() const { return !points_.empty(); }
  double fixed() const { return fixed_; }
  double per_unit() const { return per_unit_; }
  // fixed + per_unit * n (0 with no observation).
  double At(double n) const { return fixed_ + per_unit_ * n; }

 private:
  void Refit();
  void Fit(const std::deque<std::pair<double, double>>& points);
  size_t window_;
  std::deque<std::pair<double, double>> points_;  // (n, cost), oldest first
  double fixed_ = 0, per_unit_ = 0;
};

}  // namespace scd

#endif  // SCD_BASE_COST_ESTIMATE_H_
