#include "bench/cost_fit.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"

namespace scd::bench {

namespace {

using Rows = std::vector<std::vector<double>>;

absl::Status CheckInputs(const Rows& rows, const std::vector<double>& y) {
  if (rows.empty() || rows[0].empty() || rows[0].size() > kMaxFitTerms) {
    return absl::InvalidArgumentError(
        absl::StrCat("a cost fit takes 1 to ", kMaxFitTerms, " terms and at least one row"));
  }
  const size_t terms = rows[0].size();
  if (rows.size() != y.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(rows.size(), " rows against ", y.size(), " costs"));
  }
  if (rows.size() < terms) {
    return absl::InvalidArgumentError(
        absl::StrCat(rows.size(), " observations cannot fit ", terms, " terms"));
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i].size() != terms) {
      return absl::InvalidArgumentError(
          absl::StrCat("row ", i, " has ", rows[i].size(), " terms, not ", terms));
    }
    for (double v : rows[i]) {
      if (!std::isfinite(v)) return absl::InvalidArgumentError(absl::StrCat("row ", i, ": ", v));
    }
    if (!std::isfinite(y[i]))
      return absl::InvalidArgumentError(absl::StrCat("cost ", i, ": ", y[i]));
  }
  return absl::OkStatus();
}

// The terms in `mask` fitted alone (the others 0), each column divided by its scale first so
// that terms of very different sizes (tokens, tokens x context) condition alike; nullopt when
// they cannot be separated (a pivot vanishes).
std::optional<std::vector<double>> SolveSubset(const Rows& rows, const std::vector<double>& y,
                                               const std::vector<double>& scale, unsigned mask) {
  const size_t k = scale.size();
  std::vector<size_t> terms;
  for (size_t j = 0; j < k; ++j) {
    if ((mask >> j) & 1u) terms.push_back(j);
  }
  const size_t m = terms.size();
  double a[kMaxFitTerms][kMaxFitTerms + 1] = {};
  for (size_t i = 0; i < rows.size(); ++i) {
    for (size_t r = 0; r < m; ++r) {
      const double xr = rows[i][terms[r]] / scale[terms[r]];
      for (size_t c = 0; c < m; ++c) a[r][c] += xr * rows[i][terms[c]] / scale[terms[c]];
      a[r][m] += xr * y[i];
    }
  }
  const double tiny = 1e-10 * static_cast<double>(rows.size());  // the diagonal is about N
  for (size_t col = 0; col < m; ++col) {
    size_t pivot = col;
    for (size_t r = col + 1; r < m; ++r) {
      if (std::fabs(a[r][col]) > std::fabs(a[pivot][col])) pivot = r;
    }
    if (std::fabs(a[pivot][col]) <= tiny) return std::nullopt;
    for (size_t c = 0; c <= m; ++c) std::swap(a[col][c], a[pivot][c]);
    for (size_t r = col + 1; r < m; ++r) {
      const double f = a[r][col] / a[col][col];
      for (size_t c = col; c <= m; ++c) a[r][c] -= f * a[col][c];
    }
  }
  std::vector<double> solved(m);
  for (size_t r = m; r-- > 0;) {
    double v = a[r][m];
    for (size_t c = r + 1; c < m; ++c) v -= a[r][c] * solved[c];
    solved[r] = v / a[r][r];
  }
  std::vector<double> coefficients(k, 0.0);
  for (size_t r = 0; r < m; ++r) coefficients[terms[r]] = solved[r] / scale[terms[r]];
  return coefficients;
}

double SquaredResidual(const Rows& rows, const std::vector<double>& y,
                       const std::vector<double>& coefficients) {
  double sum = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    double predicted = 0;
    for (size_t j = 0; j < coefficients.size(); ++j) predicted += coefficients[j] * rows[i][j];
    sum += (y[i] - predicted) * (y[i] - predicted);
  }
  return sum;
}

}  // namespace

absl::StatusOr<CostFit> FitNonNegative(const Rows& measured_rows,
                                       const std::vector<double>& measured) {
  if (absl::Status checked = CheckInputs(measured_rows, measured); !checked.ok()) return checked;
  // Relative residuals: each observation divided by its cost (at least 1 % of the costs' rms,
  // so a zero cost weighs as a small one), so a short prompt's cost counts as much as a long one's.
  double measured_squares = 0;
  for (double v : measured) measured_squares += v * v;
  const double rms = std::sqrt(measured_squares / static_cast<double>(measured.size()));
  Rows rows = measured_rows;
  std::vector<double> y = measured;
  for (size_t i = 0; i < rows.size(); ++i) {
    const double floor = 0.01 * rms;
    const double w =
        std::fabs(y[i]) > floor ? 1.0 / std::fabs(y[i]) : (floor > 0 ? 1.0 / floor : 1.0);
    for (double& v : rows[i]) v *= w;
    y[i] *= w;
  }
  const size_t k = rows[0].size();
  std::vector<double> scale(k, 0.0);
  for (size_t j = 0; j < k; ++j) {
    for (const std::vector<double>& row : rows) scale[j] += row[j] * row[j];
    scale[j] = std::sqrt(scale[j] / static_cast<double>(rows.size()));
  }
  double y_squares = 0;
  for (double v : y) y_squares += v * v;
  // The empty subset (every coefficient 0) is always feasible; a larger one replaces the best
  // only when it lowers the residual beyond rounding, so ties keep fewer terms.
  std::vector<double> best(k, 0.0);
  double best_residual = y_squares;
  unsigned best_terms = 0;
  for (unsigned mask = 1; mask < (1u << k); ++mask) {
    bool seen = true;
    for (size_t j = 0; j < k; ++j) seen = seen && (!((mask >> j) & 1u) || scale[j] > 0);
    if (!seen) continue;
    std::optional<std::vector<double>> solved = SolveSubset(rows, y, scale, mask);
    if (!solved.has_value()) continue;
    if (std::any_of(solved->begin(), solved->end(), [](double c) { return c < 0; })) continue;
    const double residual = SquaredResidual(rows, y, *solved);
    const unsigned terms = static_cast<unsigned>(__builtin_popcount(mask));
    const double margin = 1e-12 * y_squares;
    if (residual < best_residual - margin ||
        (residual <= best_residual + margin && terms < best_terms)) {
      best = *std::move(solved);
      best_residual = residual;
      best_terms = terms;
    }
  }
  CostFit fit;
  fit.coefficients = std::move(best);
  fit.rms_relative_residual = std::sqrt(best_residual / static_cast<double>(rows.size()));
  fit.rms_residual = std::sqrt(SquaredResidual(measured_rows, measured, fit.coefficients) /
                               static_cast<double>(rows.size()));
  fit.rms_cost = rms;
  return fit;
}

}  // namespace scd::bench
