#include "tokenizer/normalizer.h"

#include <utf8proc.h>

#include <cstdlib>
#include <utility>
#include <vector>

#include "base/status_macros.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace scd::tokenizer_internal {
namespace {

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
      : steps_(std::move(steps)) {}
  void Normalize(std::string* text) const override {
    for (const auto& step : steps_) step->Normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void Normalize(std::string* text) const override {
    // HF only prepends to non-empty strings, so encode("") yields no "▁" token.
    if (!text->empty()) text->insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(std::unique_ptr<Pattern> pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void Normalize(std::string* text) const override {
    *text = ReplaceAll(*pattern_, *text, content_);
  }

 private:
  std::unique_ptr<Pattern> pattern_;
  std::string content_;
};

class UnicodeNormalizer : public Normalizer {
 public:
  explicit UnicodeNormalizer(utf8proc_option_t options) : options_(options) {}
  void Normalize(std::string* text) const override {
    if (text->empty()) return;
    utf8proc_uint8_t* result = nullptr;
    const utf8proc_ssize_t n =
        utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text->data()),
                     static_cast<utf8proc_ssize_t>(text->size()), &result, options_);
    // utf8proc only fails on invalid UTF-8 or allocation failure; the input was validated.
    if (n >= 0) text->assign(reinterpret_cast<const char*>(result), static_cast<size_t>(n));
    std::free(result);
  }

 private:
  utf8proc_option_t options_;
};

class LowercaseNormalizer : public Normalizer {
 public:
  void Normalize(std::string* text) const override {
    std::string out;
    out.reserve(text->size());
    size_t pos = 0;
    while (pos < text->size()) AppendLowercase(NextCodePoint(*text, &pos), &out);
    *text = std::move(out);
  }
};

class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void Normalize(std::string* text) const override {
    size_t begin = 0, end = text->size();
    if (left_) {
      while (begin < end) {
        size_t next = begin;
        if (!IsWhiteSpace(NextCodePoint(*text, &next))) break;
        begin = next;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<unsigned char>((*text)[start]) & 0xC0) == 0x80) {
          --start;
        }
        size_t next = start;
        if (!IsWhiteSpace(NextCodePoint(*text, &next))) break;
        end = start;
      }
    }
    *text = text->substr(begin, end - begin);
  }

 private:
  bool left_;
  bool right_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const Json& json,
                                                            std::string_view path) {
  SCD_ASSIGN_OR_RETURN(const std::string type, GetType(json, path));
  if (type == "Sequence") {
    SCD_ASSIGN_OR_RETURN(const Json* list, RequiredField(json, path, "normalizers"));
    const std::string list_path = JsonPath(path, "normalizers");
    if (!list->is_array()) return JsonError(list_path, "must be an array");
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (size_t i = 0; i < list->size(); ++i) {
      SCD_ASSIGN_OR_RETURN(auto step, ParseNormalizer((*list)[i], Concat(list_path, "[", i, "]")));
      steps.push_back(std::move(step));
    }
    return std::make_unique<SequenceNormalizer>(std::move(steps));
  }
  if (type == "Prepend") {
    SCD_ASSIGN_OR_RETURN(std::string prefix, GetString(json, path, "prepend"));
    return std::make_unique<PrependNormalizer>(std::move(prefix));
  }
  if (type == "Replace") {
    SCD_ASSIGN_OR_RETURN(const Json* pattern_json, RequiredField(json, path, "pattern"));
    SCD_ASSIGN_OR_RETURN(auto pattern, ParsePattern(*pattern_json, JsonPath(path, "pattern")));
    SCD_ASSIGN_OR_RETURN(std::string content, GetString(json, path, "content"));
    return std::make_unique<ReplaceNormalizer>(std::move(pattern), std::move(content));
  }
  if (type == "NFC") {
    return std::make_unique<UnicodeNormalizer>(
        static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  }
  if (type == "NFD") {
    return std::make_unique<UnicodeNormalizer>(
        static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE));
  }
  if (type == "NFKC") {
    return std::make_unique<UnicodeNormalizer>(
        static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT));
  }
  if (type == "NFKD") {
    return std::make_unique<UnicodeNormalizer>(
        static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT));
  }
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "Strip") {
    SCD_ASSIGN_OR_RETURN(const bool left, GetBool(json, path, "strip_left", true));
    SCD_ASSIGN_OR_RETURN(const bool right, GetBool(json, path, "strip_right", true));
    return std::make_unique<StripNormalizer>(left, right);
  }
  return JsonError(JsonPath(path, "type"), Concat("\"", type, "\" is not supported"));
}

}  // namespace scd::tokenizer_internal
