#include "base/file_util.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "absl/strings/str_cat.h"

namespace scd {
namespace {

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

}  // namespace

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return absl::NotFoundError(absl::StrCat(path, ": is a directory, not a file"));
  }
  File f(std::fopen(path.c_str(), "rb"));
  if (f == nullptr) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  std::string out;
  char buffer[1 << 16];
  size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof(buffer), f.get())) > 0) out.append(buffer, n);
  if (std::ferror(f.get())) {
    return absl::DataLossError(absl::StrCat(path, ": read failed: ", std::strerror(errno)));
  }
  return out;
}

absl::Status WriteStringToFile(const std::string& path, std::string_view contents) {
  File f(std::fopen(path.c_str(), "wb"));
  if (f == nullptr) {
    return absl::PermissionDeniedError(
        absl::StrCat(path, ": cannot write: ", std::strerror(errno)));
  }
  if (std::fwrite(contents.data(), 1, contents.size(), f.get()) != contents.size() ||
      std::fflush(f.get()) != 0) {
    return absl::DataLossError(absl::StrCat(path, ": write failed: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status CreateDirectories(const std::string& path) {
  std::error_code error;
  std::filesystem::create_directories(path, error);
  if (error) {
    return absl::PermissionDeniedError(
        absl::StrCat(path, ": cannot create the directory: ", error.message()));
  }
  if (!std::filesystem::is_directory(path, error)) {
    return absl::PermissionDeniedError(absl::StrCat(path, ": not a directory"));
  }
  return absl::OkStatus();
}

}  // namespace scd
