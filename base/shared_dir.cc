#include "base/shared_dir.h"

#include <cstdlib>
#include <filesystem>

namespace scd {

namespace fs = std::filesystem;

std::string ExecutableDir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : exe.parent_path().string();
}

std::string FindSharedDirBeside(const std::string& start_dir) {
  // build/bin/scd: the ancestors are build/bin, build, <checkout>, ...; shared/ sits beside the
  // checkout, i.e. it is a sibling of one of them.
  std::error_code ec;
  for (fs::path dir = fs::absolute(start_dir, ec).lexically_normal();
       dir.has_parent_path() && dir != dir.parent_path(); dir = dir.parent_path()) {
    const fs::path candidate = dir.parent_path() / "shared";
    if (fs::is_directory(candidate / "models", ec)) return candidate.string();
  }
  return "";
}

std::string ResolveSharedDir(const std::string& flag) {
  if (!flag.empty()) return flag;
  const char* env = std::getenv("SCD_SHARED_DIR");
  if (env != nullptr && *env != '\0') return env;
  const std::string exe_dir = ExecutableDir();
  if (!exe_dir.empty()) {
    std::string beside = FindSharedDirBeside(exe_dir);
    if (!beside.empty()) return beside;
  }
  std::error_code ec;
  return (fs::current_path(ec) / ".." / "shared").lexically_normal().string();
}

}  // namespace scd
