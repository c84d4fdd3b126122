#include "base/plot_script.h"

#include <cstdlib>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/child_process.h"

namespace scd {

std::string PlotScriptDir() {
  if (const char* dir = std::getenv("SCD_PLOT_SCRIPTS"); dir != nullptr && *dir != '\0') {
    return dir;
  }
  return std::string(SCD_PLOT_SCRIPT_DIR);
}

absl::Status RunPlotScript(const std::string& script, const std::vector<std::string>& args) {
  namespace fs = std::filesystem;
  const std::string path = (fs::path(PlotScriptDir()) / script).string();
  if (!fs::exists(path)) {
    return absl::NotFoundError(
        absl::StrCat("plot script ", path, " not found (set $SCD_PLOT_SCRIPTS to its folder)"));
  }
  std::vector<std::string> argv = {fs::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3",
                                   path};
  argv.insert(argv.end(), args.begin(), args.end());
  absl::StatusOr<ChildProcess::Outcome> run = ChildProcess::Run(argv, absl::Minutes(5));
  if (!run.ok()) return run.status();
  const int status = run->status;
  const std::string& tail = run->output;
  if (status == 0) return absl::OkStatus();
  if (absl::StrContains(tail, "No module named 'matplotlib'")) {
    return absl::FailedPreconditionError(
        "plots need Debian's python3-matplotlib (scripts/setup.sh installs it)");
  }
  return absl::InternalError(absl::StrCat(script, " failed: ", run->ending, "; its output ends:\n",
                                          tail.empty() ? "(nothing)" : tail));
}

}  // namespace scd
