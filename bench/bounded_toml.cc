#include "bench/bounded_toml.h"

#include <cmath>
#include <filesystem>
#include <optional>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/file_util.h"

namespace scd::bench {
namespace {

std::string Bound(double v) { return absl::StrFormat("%g", v); }

absl::Status ReadText(const std::string& name, const toml::node& node, std::string* out) {
  const std::optional<std::string> text = node.value_exact<std::string>();
  if (!text.has_value()) return absl::InvalidArgumentError(absl::StrCat(name, ": not a string"));
  if (text->size() > kMaxTomlString) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": over ", kMaxTomlString, " bytes"));
  }
  for (unsigned char c : *text) {
    if (c < 0x20 || c == 0x7f) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": a control character"));
    }
  }
  *out = *text;
  return absl::OkStatus();
}

absl::Status ReadField(const std::string& name, const toml::node& node, const TomlField& field) {
  if (field.text != nullptr) return ReadText(name, node, field.text);
  if (field.flag != nullptr) {
    const std::optional<bool> v = node.value_exact<bool>();
    if (!v.has_value()) return absl::InvalidArgumentError(absl::StrCat(name, ": not a boolean"));
    *field.flag = *v;
    return absl::OkStatus();
  }
  if (field.integer != nullptr) {
    const std::optional<int64_t> v = node.value_exact<int64_t>();
    if (!v.has_value() || *v < field.integer_min || *v > field.integer_max) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": not an integer from ",
                                                     field.integer_min, " to ", field.integer_max));
    }
    *field.integer = *v;
    return absl::OkStatus();
  }
  std::optional<double> v;
  if (node.is_integer()) v = static_cast<double>(*node.value_exact<int64_t>());
  if (node.is_floating_point()) v = node.value_exact<double>();
  if (!v.has_value() || !std::isfinite(*v) || *v < field.min || *v > field.max) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": not a finite number from ",
                                                   Bound(field.min), " to ", Bound(field.max)));
  }
  *field.number = *v;
  return absl::OkStatus();
}

}  // namespace

TomlField TomlField::Number(double* v, double min, double max) {
  TomlField f;
  f.number = v;
  f.min = min;
  f.max = max;
  return f;
}

TomlField TomlField::Integer(int64_t* v, int64_t min, int64_t max) {
  TomlField f;
  f.integer = v;
  f.integer_min = min;
  f.integer_max = max;
  return f;
}

TomlField TomlField::Text(std::string* v) {
  TomlField f;
  f.text = v;
  return f;
}

TomlField TomlField::Flag(bool* v) {
  TomlField f;
  f.flag = v;
  return f;
}

absl::StatusOr<toml::table> ParseBoundedToml(std::string_view text, size_t max_bytes,
                                             const char* what) {
  if (text.size() > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " of ", text.size(), " bytes (at most ", max_bytes, ")"));
  }
  try {
    return toml::parse(text);
  } catch (const toml::parse_error& error) {
    const toml::source_position where = error.source().begin;
    return absl::InvalidArgumentError(absl::StrCat("line ", where.line, ", column ", where.column,
                                                   ": ", std::string(error.description())));
  }
}

absl::StatusOr<std::string> ReadBoundedFile(const std::string& path, size_t max_bytes,
                                            const char* what) {
  std::error_code error;
  const uintmax_t size = std::filesystem::file_size(path, error);
  if (!error && size > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", size, " bytes, ", what, " has at most ", max_bytes));
  }
  return ReadFileToString(path);
}

absl::Status ReadTomlTable(const toml::table& table, const std::string& where,
                           const TomlFields& fields) {
  for (const auto& [key_name, node] : table) {
    const std::string key(key_name.str());
    const std::string name = where.empty() ? key : absl::StrCat(where, ".", key);
    const auto field = fields.find(key);
    if (field == fields.end()) {
      return absl::InvalidArgumentError(node.is_table() && where.empty()
                                            ? absl::StrCat("unknown table [", name, "]")
                                            : absl::StrCat("unknown key ", name));
    }
    if (absl::Status read = ReadField(name, node, field->second); !read.ok()) return read;
  }
  return absl::OkStatus();
}

absl::StatusOr<const toml::table*> TomlTableAt(const toml::node& node, const std::string& name) {
  const toml::table* table = node.as_table();
  if (table == nullptr) return absl::InvalidArgumentError(absl::StrCat(name, " is not a table"));
  return table;
}

std::string TomlNumber(double v) {
  std::string text = absl::StrFormat("%.17g", v);
  if (text.find_first_of(".e") == std::string::npos) text += ".0";
  return text;
}

std::string TomlQuoted(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace scd::bench
