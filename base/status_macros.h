// Early-return helpers for absl::Status / absl::StatusOr, used across module boundaries.
#ifndef SCD_BASE_STATUS_MACROS_H_
#define SCD_BASE_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define SCD_STATUS_CONCAT_INNER(a, b) a##b
#define SCD_STATUS_CONCAT(a, b) SCD_STATUS_CONCAT_INNER(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define SCD_RETURN_IF_ERROR(expr)              \
  do {                                         \
    ::absl::Status scd_status_ = (expr);       \
    if (!scd_status_.ok()) return scd_status_; \
  } while (0)

// `SCD_ASSIGN_OR_RETURN(auto x, F());` declares x from an absl::StatusOr or returns its error.
#define SCD_ASSIGN_OR_RETURN(lhs, expr) \
  SCD_ASSIGN_OR_RETURN_IMPL(SCD_STATUS_CONCAT(scd_statusor_, __LINE__), lhs, expr)
#define SCD_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()

#endif  // SCD_BASE_STATUS_MACROS_H_
