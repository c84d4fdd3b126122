#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer/unicode.h"

namespace scd::tokenizer_internal {
namespace {

// Unicode White_Space, the meaning of Oniguruma's `\s`, as class contents and their complement.
constexpr std::string_view kSpaceRanges =
    "\\t-\\r \\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}"
    "\\x{3000}";
constexpr std::string_view kNonSpaceRanges =
    "\\x{0}-\\x{8}\\x{e}-\\x{1f}\\x{21}-\\x{84}\\x{86}-\\x{9f}\\x{a1}-\\x{167f}\\x{1681}-\\x{1fff}"
    "\\x{200b}-\\x{2027}\\x{202a}-\\x{202e}\\x{2030}-\\x{205e}\\x{2060}-\\x{2fff}"
    "\\x{3001}-\\x{10ffff}";
// Oniguruma's Unicode `\w` (Alphabetic, marks, decimal digits, connector punctuation, joiners);
// PCRE2 10.42's UCP `\w` is letters, all numbers and underscore.
constexpr std::string_view kWordRanges =
    "\\p{L}\\p{M}\\p{Nd}\\p{Nl}\\p{Pc}\\x{200c}\\x{200d}\\x{24b6}-\\x{24e9}\\x{1f130}-\\x{1f149}"
    "\\x{1f150}-\\x{1f169}\\x{1f170}-\\x{1f189}";

}  // namespace

absl::StatusOr<std::string> TranslateOnigPattern(std::string_view p) {
  std::string out;
  out.reserve(p.size() * 2);
  bool in_class = false;
  size_t class_start = 0;  // index just after the class's '[' or '[^'
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[++i];
      switch (e) {
        case 's':
          out += in_class ? Concat(kSpaceRanges) : Concat("[", kSpaceRanges, "]");
          break;
        case 'S':
          out += in_class ? Concat(kNonSpaceRanges) : Concat("[^", kSpaceRanges, "]");
          break;
        case 'w':
          out += in_class ? Concat(kWordRanges) : Concat("[", kWordRanges, "]");
          break;
        case 'W':
          if (in_class) {
            return absl::InvalidArgumentError(
                Concat("regex \"", p, "\": \\W inside a character class is not supported"));
          }
          out += Concat("[^", kWordRanges, "]");
          break;
        case 'h':
          out += in_class ? "0-9a-fA-F" : "[0-9a-fA-F]";
          break;
        case 'H':
          if (in_class) {
            return absl::InvalidArgumentError(
                Concat("regex \"", p, "\": \\H inside a character class is not supported"));
          }
          out += "[^0-9a-fA-F]";
          break;
        default:
          out.push_back('\\');
          out.push_back(e);
      }
      continue;
    }
    if (!in_class) {
      if (c == '[') {
        in_class = true;
        out.push_back(c);
        if (i + 1 < p.size() && p[i + 1] == '^') out.push_back(p[++i]);
        class_start = i + 1;
        continue;
      }
      out.push_back(c);
      continue;
    }
    // Inside a character class.
    if (c == ']' && i != class_start) {
      in_class = false;
    } else if (c == '[') {
      if (i + 1 < p.size() && p[i + 1] == ':') {
        const size_t close = p.find(":]", i + 2);
        if (close == std::string_view::npos) {
          return absl::InvalidArgumentError(Concat("regex \"", p, "\": unterminated [:"));
        }
        out.append(p.substr(i, close + 2 - i));
        i = close + 1;
        continue;
      }
      return absl::InvalidArgumentError(
          Concat("regex \"", p, "\": nested character classes are not supported"));
    } else if (c == '&' && i + 1 < p.size() && p[i + 1] == '&') {
      return absl::InvalidArgumentError(
          Concat("regex \"", p, "\": class intersection (&&) is not supported"));
    }
    out.push_back(c);
  }
  return out;
}

struct Pattern::Regexp {
  pcre2_code* code = nullptr;
  ~Regexp() { pcre2_code_free(code); }
};

Pattern::~Pattern() = default;

absl::StatusOr<std::unique_ptr<Pattern>> Pattern::Regex(std::string_view onig_pattern) {
  auto translated = TranslateOnigPattern(onig_pattern);
  if (!translated.ok()) return translated.status();
  pcre2_compile_context* context = pcre2_compile_context_create(nullptr);
  pcre2_set_newline(context, PCRE2_NEWLINE_LF);
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated->data()), translated->size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &error, &error_offset, context);
  pcre2_compile_context_free(context);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return absl::InvalidArgumentError(Concat(
        "regex \"", onig_pattern, "\" does not compile: ", reinterpret_cast<const char*>(message)));
  }
  // JIT is only a speed-up; the interpreter gives the same matches if it is unavailable.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  auto pattern = std::unique_ptr<Pattern>(new Pattern());
  pattern->regex_ = std::make_unique<Regexp>();
  pattern->regex_->code = code;
  return pattern;
}

std::unique_ptr<Pattern> Pattern::Literal(std::string_view text) {
  auto pattern = std::unique_ptr<Pattern>(new Pattern());
  pattern->literal_ = std::string(text);
  return pattern;
}

std::vector<PatternSplit> Pattern::FindMatches(std::string_view text) const {
  if (text.empty()) return {{0, 0, false}};
  pcre2_match_data* match_data =
      regex_ ? pcre2_match_data_create_from_pattern(regex_->code, nullptr) : nullptr;
  // Finds the leftmost match at or after `from`.
  auto search = [&](size_t from, size_t* start, size_t* end) {
    if (!regex_) {
      const size_t at = text.find(literal_, from);
      if (at == std::string_view::npos) return false;
      *start = at;
      *end = at + literal_.size();
      return true;
    }
    int rc = pcre2_match(regex_->code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), from,
                         PCRE2_NO_UTF_CHECK, match_data, nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      rc = pcre2_match(regex_->code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), from,
                       PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, match_data, nullptr);
    }
    if (rc < 0) return false;
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match_data);
    *start = ovector[0];
    *end = ovector[1];
    return true;
  };

  std::vector<PatternSplit> splits;
  size_t prev = 0;
  // The onig crate's find_iter: an empty match right where the previous match ended is skipped
  // by moving the search start one character forward.
  size_t last_end = 0;
  bool has_last_match = false;
  size_t last_match_end = 0;
  while (last_end <= text.size()) {
    size_t start = 0, end = 0;
    if (!search(last_end, &start, &end)) break;
    if (start == end && has_last_match && last_match_end == end) {
      if (last_end < text.size()) {
        NextCodePoint(text, &last_end);
      } else {
        ++last_end;
      }
      continue;
    }
    last_end = end;
    has_last_match = true;
    last_match_end = end;
    if (prev != start) splits.push_back({prev, start, false});
    splits.push_back({start, end, true});
    prev = end;
  }
  if (prev != text.size()) splits.push_back({prev, text.size(), false});
  if (match_data != nullptr) pcre2_match_data_free(match_data);
  return splits;
}

}  // namespace scd::tokenizer_internal

namespace scd::tokenizer_internal {

absl::StatusOr<std::unique_ptr<Pattern>> ParsePattern(const Json& json, std::string_view path) {
  if (!json.is_object() || json.size() != 1) {
    return JsonError(path, "must be {\"String\": ...} or {\"Regex\": ...}");
  }
  const std::string kind = json.begin().key();
  const Json& value = json.begin().value();
  if (!value.is_string()) return JsonError(JsonPath(path, kind), "must be a string");
  const std::string text = value.get<std::string>();
  if (kind == "String") return Pattern::Literal(text);
  if (kind == "Regex") {
    auto regex = Pattern::Regex(text);
    if (!regex.ok()) return JsonError(JsonPath(path, kind), std::string(regex.status().message()));
    return regex;
  }
  return JsonError(path, Concat("pattern kind \"", kind, "\" is not supported"));
}

std::string ReplaceAll(const Pattern& pattern, std::string_view text, std::string_view content) {
  std::string out;
  out.reserve(text.size());
  for (const PatternSplit& split : pattern.FindMatches(text)) {
    if (split.is_match) {
      out.append(content);
    } else {
      out.append(text.substr(split.start, split.end - split.start));
    }
  }
  return out;
}

}  // namespace scd::tokenizer_internal
