// The figures of `scd-calib eval`: per-layer depth errors and the rank sweep, each written as a
// CSV and an SVG (base/svg_plot.h) into a folder; each returns the text the tool prints.
// Thread-safety: not thread-safe (uses the Evaluation).
#ifndef SCD_CALIB_EVAL_REPORT_H_
#define SCD_CALIB_EVAL_REPORT_H_

#include <string>

#include "absl/status/statusor.h"
#include "calib/evaluation.h"
#include "codec/artifact.h"

namespace scd {

// depth_errors.{csv,svg}: relative l2 error of each layer's attention input, reuse vs scd.
absl::StatusOr<std::string> WriteDepthErrors(Evaluation& eval, const Artifact& artifact,
                                             const TransferOptions& transfer,
                                             const std::string& out_dir);

// rank_sweep.{csv,svg}: KL vs payload over nested (r_K, r_V), Pareto front marked.
absl::StatusOr<std::string> WriteRankSweep(Evaluation& eval, const Artifact& artifact,
                                           const TransferOptions& transfer,
                                           const std::string& out_dir);

}  // namespace scd

#endif  // SCD_CALIB_EVAL_REPORT_H_
