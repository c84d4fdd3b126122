// FitQuickArtifact: a producer -> consumer artifact fitted in seconds by `scd-calib fit` (one
// frontier point, small ranks, few windows): real translators, not good ones -- what a harness
// needs to run codes end to end (the soak, the profile's test), not what a deployment serves.
// Thread-safety: reentrant (a child process per call).
#ifndef SCD_BENCH_QUICK_ARTIFACT_H_
#define SCD_BENCH_QUICK_ARTIFACT_H_

#include <string>

#include "absl/status/statusor.h"

namespace scd::bench {

// Fits the pair (model directories) into `path` (kept when it exists already: the fit is not
// repeated) with `bin_dir`/scd-calib and the shared folder's data; the path, or INTERNAL with
// scd-calib's output.
absl::StatusOr<std::string> FitQuickArtifact(const std::string& bin_dir,
                                             const std::string& shared_dir,
                                             const std::string& producer,
                                             const std::string& consumer, const std::string& path);

}  // namespace scd::bench

#endif  // SCD_BENCH_QUICK_ARTIFACT_H_
