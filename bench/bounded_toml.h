// BoundedToml: how the cluster simulator's input files (node profiles, deployments, workloads)
// are read, one set of rules for all of them: the text bounded in size before it is parsed
// (toml++; a syntax error names its line and column), every key of a table read into a field
// with bounds -- numbers finite within [min, max], integers exact within theirs, strings of at
// most kMaxTomlString printable bytes, booleans --, and a key or table no field names refused
// by name (a typo is not a default). And the writer's half: numbers with 17 significant digits,
// so a file written reads back exactly, and strings quoted.
// Thread-safety: stateless functions.
#ifndef SCD_BENCH_BOUNDED_TOML_H_
#define SCD_BENCH_BOUNDED_TOML_H_

#include <toml++/toml.h>

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace scd::bench {

constexpr size_t kMaxTomlString = 256;
constexpr int64_t kMaxTomlInteger = int64_t{1} << 53;
constexpr double kMaxTomlNumber = 1e15;

// Where one key lands, and its bounds.
struct TomlField {
  double* number = nullptr;
  int64_t* integer = nullptr;
  std::string* text = nullptr;
  bool* flag = nullptr;
  double min = 0, max = kMaxTomlNumber;                    // numbers
  int64_t integer_min = 0, integer_max = kMaxTomlInteger;  // integers, exactly

  static TomlField Number(double* v, double min = 0, double max = kMaxTomlNumber);
  static TomlField Integer(int64_t* v, int64_t min = 0, int64_t max = kMaxTomlInteger);
  static TomlField Text(std::string* v);
  static TomlField Flag(bool* v);
};
using TomlFields = std::map<std::string, TomlField>;

// The root table of `text`, or INVALID_ARGUMENT: over `max_bytes` (naming `what`: "a profile"),
// or the syntax error's line and column.
absl::StatusOr<toml::table> ParseBoundedToml(std::string_view text, size_t max_bytes,
                                             const char* what);
// The file's text, at most `max_bytes` (INVALID_ARGUMENT naming the path and `what` otherwise;
// NOT_FOUND when it cannot be read).
absl::StatusOr<std::string> ReadBoundedFile(const std::string& path, size_t max_bytes,
                                            const char* what);
// Reads every key of `table` into its field; names in errors are `where` + "." + key ("" where:
// the key alone). INVALID_ARGUMENT: "unknown key NAME" (or "unknown table [NAME]" for a table
// no field names), "NAME: not a string", "NAME: not a finite number from MIN to MAX", ...
absl::Status ReadTomlTable(const toml::table& table, const std::string& where,
                           const TomlFields& fields);
// The table at `node`, or INVALID_ARGUMENT "NAME is not a table".
absl::StatusOr<const toml::table*> TomlTableAt(const toml::node& node, const std::string& name);

// A number as TOML reads it back exactly: 17 significant digits, a float's form kept.
std::string TomlNumber(double v);
// A basic TOML string of printable text.
std::string TomlQuoted(const std::string& text);

}  // namespace scd::bench

#endif  // SCD_BENCH_BOUNDED_TOML_H_
