// The figures of `scd-calib eval`: per-layer depth errors, the rank sweep and the frontier, each
// written as a CSV and a PNG (bench/plot_calib.py) into a folder; each returns the text the tool
// prints. Thread-safety: not thread-safe (uses the Evaluation).
#ifndef SCD_CALIB_EVAL_REPORT_H_
#define SCD_CALIB_EVAL_REPORT_H_

#include <string>

#include "absl/status/statusor.h"
#include "calib/evaluation.h"
#include "codec/artifact.h"

namespace scd {

// depth_errors.{csv,png}: relative l2 error of each layer's attention input, reuse vs scd.
absl::StatusOr<std::string> WriteDepthErrors(Evaluation& eval, const Artifact& artifact,
                                             const TransferOptions& transfer,
                                             const std::string& out_dir);

// rank_sweep.{csv,png}: KL vs payload over nested (r_K, r_V), Pareto front marked.
absl::StatusOr<std::string> WriteRankSweep(Evaluation& eval, const Artifact& artifact,
                                           const TransferOptions& transfer,
                                           const std::string& out_dir);

// frontier.{csv,png}: the artifact's frontier points measured again on this evaluation's windows,
// beside the fixed modes (scd at the fitted ranks, reuse, int4, raw), and for each fixed mode the
// frontier's best point at or under its bytes (FAILED_PRECONDITION: no frontier in the artifact).
absl::StatusOr<std::string> WriteFrontierEval(Evaluation& eval, const Artifact& artifact,
                                              const std::string& out_dir);

}  // namespace scd

#endif  // SCD_CALIB_EVAL_REPORT_H_
