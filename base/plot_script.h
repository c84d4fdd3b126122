// The project's one plotting path: figures are drawn by the matplotlib scripts in bench/
// (Debian's python3-matplotlib), from the CSV/JSON files the C++ tools write. RunPlotScript runs
// one with Debian's /usr/bin/python3 (a python3 earlier on PATH, e.g. pyenv's, may lack
// matplotlib; else python3 from PATH), the script found in the source tree the binary was built
// from ($SCD_PLOT_SCRIPTS overrides the folder, e.g. in a container image).
// Thread-safety: reentrant (runs a child process and waits for it).
#ifndef SCD_BASE_PLOT_SCRIPT_H_
#define SCD_BASE_PLOT_SCRIPT_H_

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace scd {

// The folder holding the plotting scripts.
std::string PlotScriptDir();

// Runs `PlotScriptDir()/script` with `args` (no shell). INTERNAL with the script's stderr tail
// when it fails (FAILED_PRECONDITION naming python3-matplotlib when matplotlib is missing).
absl::Status RunPlotScript(const std::string& script, const std::vector<std::string>& args);

}  // namespace scd

#endif  // SCD_BASE_PLOT_SCRIPT_H_
