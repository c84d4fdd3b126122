// Patterns for the tokenizer's Split / Replace components, matching the way the HF `tokenizers`
// library does: regexes are written for Oniguruma (Ruby syntax) and run here on PCRE2 after a
// translation of the constructs whose meaning differs; string patterns match literally.
//
// Thread-safety: a constructed Pattern is immutable; FindMatches is safe from many threads.
#ifndef SCD_TOKENIZER_REGEX_H_
#define SCD_TOKENIZER_REGEX_H_

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "tokenizer/json.h"

namespace scd::tokenizer_internal {

// One piece of a split: [start, end) byte offsets and whether it is a match of the pattern.
struct PatternSplit {
  size_t start;
  size_t end;
  bool is_match;
};

// Rewrites an Oniguruma pattern into a PCRE2 pattern with the same meaning (under
// PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE): `\s`/`\S` become Unicode White_Space classes (PCRE2's
// differ, e.g. on U+180E), `\w`/`\W` take Oniguruma's Unicode word definition and `\h` means a
// hex digit. Errors on constructs that cannot be rewritten faithfully (nested classes).
absl::StatusOr<std::string> TranslateOnigPattern(std::string_view pattern);

class Pattern {
 public:
  // Compiles an Oniguruma regex; the error names the pattern.
  static absl::StatusOr<std::unique_ptr<Pattern>> Regex(std::string_view onig_pattern);
  // A pattern matching `text` literally (HF escapes string patterns into regexes).
  static std::unique_ptr<Pattern> Literal(std::string_view text);

  ~Pattern();
  Pattern(const Pattern&) = delete;
  Pattern& operator=(const Pattern&) = delete;

  // HF's Pattern::find_matches: consecutive splits covering all of `text` (a single non-match
  // split for empty text), iterating matches like the onig crate's find_iter.
  // REQUIRES: `text` is valid UTF-8.
  std::vector<PatternSplit> FindMatches(std::string_view text) const;

 private:
  struct Regexp;
  Pattern() = default;

  std::string literal_;
  std::unique_ptr<Regexp> regex_;  // null for literal patterns
};

// Reads a {"String": s} or {"Regex": r} pattern object at `path`.
absl::StatusOr<std::unique_ptr<Pattern>> ParsePattern(const Json& json, std::string_view path);

// Replaces every match of `pattern` in `text` by `content` (no group references, like HF).
std::string ReplaceAll(const Pattern& pattern, std::string_view text, std::string_view content);

}  // namespace scd::tokenizer_internal

#endif  // SCD_TOKENIZER_REGEX_H_
