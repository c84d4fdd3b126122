#include "bench/quick_artifact.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "base/child_process.h"
#include "base/status_macros.h"

namespace scd::bench {

absl::StatusOr<std::string> FitQuickArtifact(const std::string& bin_dir,
                                             const std::string& shared_dir,
                                             const std::string& producer,
                                             const std::string& consumer, const std::string& path) {
  namespace fs = std::filesystem;
  if (fs::exists(path)) return path;
  SCD_ASSIGN_OR_RETURN(ChildProcess::Outcome fit, ChildProcess::Run({bin_dir + "/scd-calib",
                                                                     "fit",
                                                                     "--quiet",
                                                                     "--producer",
                                                                     producer,
                                                                     "--consumer",
                                                                     consumer,
                                                                     "--out",
                                                                     path + ".tmp",
                                                                     "--shared-dir",
                                                                     shared_dir,
                                                                     "--rank-k",
                                                                     "1",
                                                                     "--rank-v",
                                                                     "2",
                                                                     "--rank-h",
                                                                     "16",
                                                                     "--patch-budget",
                                                                     "2",
                                                                     "--aligner-seconds",
                                                                     "0",
                                                                     "--prefixes",
                                                                     "40",
                                                                     "--tokens",
                                                                     "64",
                                                                     "--aligner-epochs",
                                                                     "5",
                                                                     "--heldout-windows",
                                                                     "8",
                                                                     "--frontier-dtypes",
                                                                     "f16",
                                                                     "--frontier-points",
                                                                     "1",
                                                                     "--frontier-ladder",
                                                                     "1",
                                                                     "--no-vocab-sweep"}));
  if (fit.status != 0) {
    return absl::InternalError(
        absl::StrCat("scd-calib fit of ", producer, " -> ", consumer, " failed:\n", fit.output));
  }
  fs::rename(path + ".tmp", path);
  return path;
}

}  // namespace scd::bench
