#include "tools/tool_common.h"

#include <spdlog/spdlog.h>

#include <cstdio>

#include "base/exception_guard.h"
#include "base/shared_dir.h"

namespace scd {

std::string CommonToolFlags::SharedDir() const { return ResolveSharedDir(shared_dir); }

void AddCommonFlags(CLI::App* command, CommonToolFlags* flags, unsigned which) {
  if (which & kThreadsFlag) {
    command->add_option("--threads", flags->threads, "compute threads (0 = all cores)")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
  }
  if (which & kLogLevelFlag) {
    command->add_option("--log-level", flags->log_level, "trace|debug|info|warn|error|off")
        ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}))
        ->capture_default_str();
  }
  if (which & kQuietFlag) command->add_flag("--quiet", flags->quiet, "no progress output");
  if (which & kSharedDirFlag) {
    command->add_option("--shared-dir", flags->shared_dir,
                        "shared folder with models and data (default: $SCD_SHARED_DIR, else "
                        "shared/ beside the checkout)");
  }
}

int RunTool(const char* tool, CLI::App& app, int argc, char** argv, const CommonToolFlags& flags,
            const std::function<absl::Status()>& run) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  spdlog::set_level(spdlog::level::from_str(flags.log_level));
  spdlog::set_pattern("[%H:%M:%S.%e] [%l] %v");
  const absl::Status status = GuardExceptions("unexpected failure", run);
  if (!status.ok()) {
    std::fprintf(stderr, "%s: error: %s\n", tool, std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace scd
