// Typed, error-reporting accessors for reading tokenizer.json. Every error message starts with
// "tokenizer.json: " and names the field by its path (e.g. `model.merges[3]`).
//
// Thread-safety: stateless functions.
#ifndef SCD_TOKENIZER_JSON_H_
#define SCD_TOKENIZER_JSON_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace scd::tokenizer_internal {

using Json = nlohmann::json;

// absl::StrCat for std::string_view pieces (this absl's string_view is not std::string_view).
inline void AppendPiece(std::string* out, std::string_view piece) { out->append(piece); }
inline void AppendPiece(std::string* out, absl::string_view piece) {
  out->append(piece.data(), piece.size());
}
inline void AppendPiece(std::string* out, const char* piece) { out->append(piece); }
inline void AppendPiece(std::string* out, const std::string& piece) { out->append(piece); }
inline void AppendPiece(std::string* out, size_t n) { out->append(std::to_string(n)); }
template <typename... Pieces>
std::string Concat(const Pieces&... pieces) {
  std::string out;
  (AppendPiece(&out, pieces), ...);
  return out;
}

// InvalidArgument "tokenizer.json: <path> <what>".
absl::Status JsonError(std::string_view path, std::string_view what);

// Joins a path and a key: ("model", "vocab") -> "model.vocab".
std::string JsonPath(std::string_view path, std::string_view key);

// The member `key` of object `obj` (at `path`); an error if it is missing.
absl::StatusOr<const Json*> RequiredField(const Json& obj, std::string_view path,
                                          std::string_view key);

// Strings, booleans and integers; a missing or null member yields the default / nullopt.
absl::StatusOr<std::string> GetString(const Json& obj, std::string_view path, std::string_view key);
absl::StatusOr<std::optional<std::string>> GetOptionalString(const Json& obj, std::string_view path,
                                                             std::string_view key);
absl::StatusOr<bool> GetBool(const Json& obj, std::string_view path, std::string_view key,
                             bool default_value);
absl::StatusOr<int64_t> GetInt(const Json& obj, std::string_view path, std::string_view key,
                               int64_t default_value);

// The "type" member of a component, required.
absl::StatusOr<std::string> GetType(const Json& obj, std::string_view path);

// A one-character string member (Metaspace's replacement, Strip's content) as a code point.
absl::StatusOr<char32_t> GetChar(const Json& obj, std::string_view path, std::string_view key,
                                 char32_t default_value);

}  // namespace scd::tokenizer_internal

#endif  // SCD_TOKENIZER_JSON_H_
