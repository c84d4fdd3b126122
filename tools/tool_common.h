// What every command-line tool shares: the common flags (threads, log level, quiet, shared
// folder), logging set-up, and one way of ending: a failed command prints exactly one
// "<tool>: error: <message>" line on stderr and exits with status 1; nothing thrown escapes.
// Thread-safety: call from main() only.
#ifndef SCD_TOOLS_TOOL_COMMON_H_
#define SCD_TOOLS_TOOL_COMMON_H_

#include <CLI/CLI.hpp>
#include <functional>
#include <string>

#include "absl/status/status.h"

namespace scd {

struct CommonToolFlags {
  int threads = 0;                 // compute threads, 0 = all cores
  std::string log_level = "warn";  // spdlog level
  bool quiet = false;              // no progress bars
  std::string shared_dir;          // "" = resolved at run time (base/shared_dir.h)

  // The shared folder: --shared-dir, then $SCD_SHARED_DIR, then shared/ beside the checkout.
  std::string SharedDir() const;
};

enum CommonFlag : unsigned {
  kThreadsFlag = 1,
  kLogLevelFlag = 2,
  kQuietFlag = 4,
  kSharedDirFlag = 8,
  kAllCommonFlags = 15,
};

// Registers the chosen common flags on `command`, bound to `flags`.
void AddCommonFlags(CLI::App* command, CommonToolFlags* flags, unsigned which = kAllCommonFlags);

// Parses argv, sets up logging from `flags`, runs `run` and turns its status (or anything it
// throws) into the exit code. Returns the process exit status.
int RunTool(const char* tool, CLI::App& app, int argc, char** argv, const CommonToolFlags& flags,
            const std::function<absl::Status()>& run);

// Daemons. Blocks SIGTERM and SIGINT in the calling thread and so in every thread started after
// it (call first in main), so WaitForTerminationSignal can take them synchronously.
void BlockTerminationSignals();
// Waits for SIGTERM or SIGINT; returns its name.
std::string WaitForTerminationSignal();
// Writes `address` and a newline to `path` (temp file + rename: readers never see half of it);
// nothing when `path` is empty. Lets scripts and tests find a daemon that listened on port 0.
absl::Status WriteAddressFile(const std::string& path, const std::string& address);

}  // namespace scd

#endif  // SCD_TOOLS_TOOL_COMMON_H_
