// Whole-file reading and writing with checked errors: a file that cannot be opened or read is a
// NotFound / DataLoss status naming the path, never an empty string.
// Thread-safety: stateless functions.
#ifndef SCD_BASE_FILE_UTIL_H_
#define SCD_BASE_FILE_UTIL_H_

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace scd {

// The file's bytes. NotFound if it cannot be opened (missing, a directory, no permission),
// DataLoss if reading fails part-way.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

// Replaces the file's contents. PermissionDenied (naming the path) if it cannot be written.
absl::Status WriteStringToFile(const std::string& path, std::string_view contents);

// Makes the directory and its missing parents (an existing one is fine). PermissionDenied,
// naming the path and why, when it cannot (a file in the way, no permission).
absl::Status CreateDirectories(const std::string& path);

}  // namespace scd

#endif  // SCD_BASE_FILE_UTIL_H_
