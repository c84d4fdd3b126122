// FitNonNegative: least squares of relative residuals (each observation weighed by 1 / its
// cost, so a short prompt's cost is fitted as closely as a long one's), every coefficient >= 0,
// for the few-term cost models the
// cluster simulator charges (bench/node_profile.h): a prefill's microseconds against its tokens
// and the context they attend, a decode step's against its batch and context. Noise only adds
// time, so a negative term is a fit of noise; it is held at 0 and the others refitted. Exact for
// the small models here: every subset of terms is solved (normal equations, partial pivoting) and
// the feasible fit with the least squared residual kept (a subset that cannot be separated --
// two terms that always move together, a term never seen -- is skipped).
// Thread-safety: stateless functions.
#ifndef SCD_BENCH_COST_FIT_H_
#define SCD_BENCH_COST_FIT_H_

#include <cstddef>
#include <vector>

#include "absl/status/statusor.h"

namespace scd::bench {

constexpr size_t kMaxFitTerms = 4;

struct CostFit {
  std::vector<double> coefficients;  // one per term, each >= 0
  double rms_residual = 0;           // sqrt(mean squared residual), in the costs' unit
  double rms_relative_residual = 0;  // sqrt(mean squared residual / cost^2): what is minimised
  double rms_cost = 0;               // sqrt(mean squared cost): what the residual is against
};

// Fits y[i] ~ sum_j coefficients[j] * rows[i][j]. INVALID_ARGUMENT when the rows are ragged, have
// no term or more than kMaxFitTerms, hold a value that is not finite, or are fewer than the
// terms. A term no row has (all zero) gets 0.
absl::StatusOr<CostFit> FitNonNegative(const std::vector<std::vector<double>>& rows,
                                       const std::vector<double>& y);

}  // namespace scd::bench

#endif  // SCD_BENCH_COST_FIT_H_
