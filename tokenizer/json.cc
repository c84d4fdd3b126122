#include "tokenizer/json.h"

#include "tokenizer/unicode.h"

namespace scd::tokenizer_internal {

absl::Status JsonError(std::string_view path, std::string_view what) {
  return absl::InvalidArgumentError(Concat("tokenizer.json: ", path, " ", what));
}

std::string JsonPath(std::string_view path, std::string_view key) {
  return path.empty() ? std::string(key) : Concat(path, ".", key);
}

absl::StatusOr<const Json*> RequiredField(const Json& obj, std::string_view path,
                                          std::string_view key) {
  if (!obj.is_object()) return JsonError(path, "must be an object");
  auto it = obj.find(std::string(key));
  if (it == obj.end()) return JsonError(JsonPath(path, key), "is missing");
  return &*it;
}

absl::StatusOr<std::string> GetString(const Json& obj, std::string_view path,
                                      std::string_view key) {
  auto field = RequiredField(obj, path, key);
  if (!field.ok()) return field.status();
  if (!(*field)->is_string()) return JsonError(JsonPath(path, key), "must be a string");
  return (*field)->get<std::string>();
}

absl::StatusOr<std::optional<std::string>> GetOptionalString(const Json& obj, std::string_view path,
                                                             std::string_view key) {
  if (!obj.is_object()) return JsonError(path, "must be an object");
  auto it = obj.find(std::string(key));
  if (it == obj.end() || it->is_null()) return std::optional<std::string>();
  if (!it->is_string()) return JsonError(JsonPath(path, key), "must be a string or null");
  return std::optional<std::string>(it->get<std::string>());
}

absl::StatusOr<bool> GetBool(const Json& obj, std::string_view path, std::string_view key,
                             bool default_value) {
  if (!obj.is_object()) return JsonError(path, "must be an object");
  auto it = obj.find(std::string(key));
  if (it == obj.end() || it->is_null()) return default_value;
  if (!it->is_boolean()) return JsonError(JsonPath(path, key), "must be a boolean");
  return it->get<bool>();
}

absl::StatusOr<int64_t> GetInt(const Json& obj, std::string_view path, std::string_view key,
                               int64_t default_value) {
  if (!obj.is_object()) return JsonError(path, "must be an object");
  auto it = obj.find(std::string(key));
  if (it == obj.end() || it->is_null()) return default_value;
  if (!it->is_number_integer()) return JsonError(JsonPath(path, key), "must be an integer");
  return it->get<int64_t>();
}

absl::StatusOr<std::string> GetType(const Json& obj, std::string_view path) {
  return GetString(obj, path, "type");
}

absl::StatusOr<char32_t> GetChar(const Json& obj, std::string_view path, std::string_view key,
                                 char32_t default_value) {
  auto value = GetOptionalString(obj, path, key);
  if (!value.ok()) return value.status();
  if (!value->has_value()) return default_value;
  const std::string& s = **value;
  if (s.empty() || !IsValidUtf8(s)) {
    return JsonError(JsonPath(path, key), "must be a single character");
  }
  size_t pos = 0;
  const char32_t c = NextCodePoint(s, &pos);
  if (pos != s.size()) return JsonError(JsonPath(path, key), "must be a single character");
  return c;
}

}  // namespace scd::tokenizer_internal
