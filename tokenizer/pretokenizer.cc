#include "tokenizer/pretokenizer.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <utility>

#include "base/status_macros.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace scd::tokenizer_internal {
namespace {

// HF's SplitDelimiterBehavior.
enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// Reads "behavior"; required when there is no default (as for Split).
absl::StatusOr<Behavior> ParseBehavior(const Json& json, std::string_view path,
                                       std::optional<Behavior> default_value) {
  SCD_ASSIGN_OR_RETURN(auto name, GetOptionalString(json, path, "behavior"));
  if (!name.has_value()) {
    if (default_value.has_value()) return *default_value;
    return JsonError(JsonPath(path, "behavior"), "is missing");
  }
  if (*name == "Removed") return Behavior::kRemoved;
  if (*name == "Isolated") return Behavior::kIsolated;
  if (*name == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (*name == "MergedWithNext") return Behavior::kMergedWithNext;
  if (*name == "Contiguous") return Behavior::kContiguous;
  return JsonError(JsonPath(path, "behavior"), Concat("\"", *name, "\" is not supported"));
}

// NormalizedString::split: turns the pattern's splits into the kept ranges.
std::vector<PatternSplit> ApplyBehavior(std::vector<PatternSplit> matches, Behavior behavior) {
  std::vector<PatternSplit> out;  // is_match here means "remove"
  switch (behavior) {
    case Behavior::kIsolated:
      for (auto& m : matches) out.push_back({m.start, m.end, false});
      break;
    case Behavior::kRemoved:
      out = std::move(matches);
      break;
    case Behavior::kContiguous: {
      bool previous_match = false;
      for (const auto& m : matches) {
        if (m.is_match == previous_match && !out.empty()) {
          out.back().end = m.end;
        } else {
          out.push_back({m.start, m.end, false});
        }
        previous_match = m.is_match;
      }
      break;
    }
    case Behavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const auto& m : matches) {
        if (m.is_match && !previous_match && !out.empty()) {
          out.back().end = m.end;
        } else {
          out.push_back({m.start, m.end, false});
        }
        previous_match = m.is_match;
      }
      break;
    }
    case Behavior::kMergedWithNext: {
      bool previous_match = false;
      for (auto it = matches.rbegin(); it != matches.rend(); ++it) {
        if (it->is_match && !previous_match && !out.empty()) {
          out.back().start = it->start;
        } else {
          out.push_back({it->start, it->end, false});
        }
        previous_match = it->is_match;
      }
      std::reverse(out.begin(), out.end());
      break;
    }
  }
  return out;
}

// HF's Pattern impl for Fn(char) -> bool: every matching character is its own match.
std::vector<PatternSplit> CharMatches(std::string_view text,
                                      const std::function<bool(char32_t)>& pred) {
  if (text.empty()) return {{0, 0, false}};
  std::vector<PatternSplit> out;
  size_t last_offset = 0, pos = 0;
  while (pos < text.size()) {
    const size_t start = pos;
    const char32_t c = NextCodePoint(text, &pos);
    if (pred(c)) {
      if (last_offset < start) out.push_back({last_offset, start, false});
      out.push_back({start, pos, true});
      last_offset = pos;
    }
  }
  if (pos > last_offset) out.push_back({last_offset, pos, false});
  return out;
}

// Applies `split_fn` (which returns HF pattern splits for one piece) with `behavior` to every
// piece, dropping empty results.
void SplitPieces(std::vector<PreToken>* pieces, Behavior behavior, bool invert,
                 const std::function<std::vector<PatternSplit>(std::string_view)>& split_fn) {
  std::vector<PreToken> out;
  out.reserve(pieces->size());
  for (PreToken& piece : *pieces) {
    std::vector<PatternSplit> matches = split_fn(piece.text);
    if (invert) {
      for (auto& m : matches) m.is_match = !m.is_match;
    }
    for (const PatternSplit& r : ApplyBehavior(std::move(matches), behavior)) {
      if (r.is_match || r.start == r.end) continue;
      out.push_back({piece.text.substr(r.start, r.end - r.start), piece.at_origin && r.start == 0});
    }
  }
  *pieces = std::move(out);
}

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps)
      : steps_(std::move(steps)) {}
  void PreTokenize(std::vector<PreToken>* pieces) const override {
    for (const auto& step : steps_) step->PreTokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(std::unique_ptr<Pattern> pattern, Behavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  void PreTokenize(std::vector<PreToken>* pieces) const override {
    SplitPieces(pieces, behavior_, invert_,
                [this](std::string_view text) { return pattern_->FindMatches(text); });
  }

 private:
  std::unique_ptr<Pattern> pattern_;
  Behavior behavior_;
  bool invert_;
};

// The GPT-2 pattern ByteLevel uses when use_regex is set.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::unique_ptr<Pattern> regex)
      : add_prefix_space_(add_prefix_space), regex_(std::move(regex)) {}
  void PreTokenize(std::vector<PreToken>* pieces) const override {
    if (add_prefix_space_) {
      for (PreToken& piece : *pieces) {
        if (piece.text.empty() || piece.text[0] != ' ') piece.text.insert(0, " ");
      }
    }
    if (regex_ != nullptr) {
      SplitPieces(pieces, Behavior::kIsolated, false,
                  [this](std::string_view text) { return regex_->FindMatches(text); });
    }
    const auto& table = ByteToUnicode();
    for (PreToken& piece : *pieces) {
      std::string mapped;
      mapped.reserve(piece.text.size() * 2);
      for (const char b : piece.text) mapped += table[static_cast<unsigned char>(b)];
      piece.text = std::move(mapped);
    }
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Pattern> regex_;  // null when use_regex is false
};

enum class PrependScheme { kAlways, kFirst, kNever };

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspacePreTokenizer(char32_t replacement, PrependScheme scheme, bool split)
      : replacement_(replacement), scheme_(scheme), split_(split) {
    AppendUtf8(replacement, &rep_);
  }
  void PreTokenize(std::vector<PreToken>* pieces) const override {
    for (PreToken& piece : *pieces) {
      std::string replaced;
      replaced.reserve(piece.text.size());
      for (const char c : piece.text) {
        if (c == ' ') {
          replaced += rep_;
        } else {
          replaced.push_back(c);
        }
      }
      const bool starts_with_rep = replaced.compare(0, rep_.size(), rep_) == 0;
      if (!starts_with_rep && (scheme_ == PrependScheme::kAlways ||
                               (scheme_ == PrependScheme::kFirst && piece.at_origin))) {
        replaced.insert(0, rep_);
      }
      piece.text = std::move(replaced);
    }
    if (split_) {
      SplitPieces(pieces, Behavior::kMergedWithNext, false, [this](std::string_view text) {
        return CharMatches(text, [this](char32_t c) { return c == replacement_; });
      });
    }
  }

 private:
  char32_t replacement_;
  std::string rep_;
  PrependScheme scheme_;
  bool split_;
};

// A pre-tokenizer defined by a character predicate and a behavior.
class CharSplitPreTokenizer : public PreTokenizer {
 public:
  CharSplitPreTokenizer(std::function<bool(char32_t)> pred, Behavior behavior)
      : pred_(std::move(pred)), behavior_(behavior) {}
  void PreTokenize(std::vector<PreToken>* pieces) const override {
    SplitPieces(pieces, behavior_, false,
                [this](std::string_view text) { return CharMatches(text, pred_); });
  }

 private:
  std::function<bool(char32_t)> pred_;
  Behavior behavior_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const Json& json,
                                                                std::string_view path) {
  SCD_ASSIGN_OR_RETURN(const std::string type, GetType(json, path));
  if (type == "Sequence") {
    SCD_ASSIGN_OR_RETURN(const Json* list, RequiredField(json, path, "pretokenizers"));
    const std::string list_path = JsonPath(path, "pretokenizers");
    if (!list->is_array()) return JsonError(list_path, "must be an array");
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (size_t i = 0; i < list->size(); ++i) {
      SCD_ASSIGN_OR_RETURN(auto step,
                           ParsePreTokenizer((*list)[i], Concat(list_path, "[", i, "]")));
      steps.push_back(std::move(step));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(steps));
  }
  if (type == "ByteLevel") {
    SCD_ASSIGN_OR_RETURN(const bool add_prefix_space,
                         GetBool(json, path, "add_prefix_space", true));
    SCD_ASSIGN_OR_RETURN(const bool use_regex, GetBool(json, path, "use_regex", true));
    std::unique_ptr<Pattern> regex;
    if (use_regex) {
      SCD_ASSIGN_OR_RETURN(regex, Pattern::Regex(kGpt2Pattern));
    }
    return std::make_unique<ByteLevelPreTokenizer>(add_prefix_space, std::move(regex));
  }
  if (type == "Split") {
    SCD_ASSIGN_OR_RETURN(const Json* pattern_json, RequiredField(json, path, "pattern"));
    SCD_ASSIGN_OR_RETURN(auto pattern, ParsePattern(*pattern_json, JsonPath(path, "pattern")));
    SCD_ASSIGN_OR_RETURN(const Behavior behavior, ParseBehavior(json, path, std::nullopt));
    SCD_ASSIGN_OR_RETURN(const bool invert, GetBool(json, path, "invert", false));
    return std::make_unique<SplitPreTokenizer>(std::move(pattern), behavior, invert);
  }
  if (type == "Metaspace") {
    SCD_ASSIGN_OR_RETURN(const char32_t replacement, GetChar(json, path, "replacement", U'\u2581'));
    SCD_ASSIGN_OR_RETURN(auto scheme_name, GetOptionalString(json, path, "prepend_scheme"));
    PrependScheme scheme = PrependScheme::kAlways;
    if (scheme_name.has_value()) {
      if (*scheme_name == "always") {
        scheme = PrependScheme::kAlways;
      } else if (*scheme_name == "first") {
        scheme = PrependScheme::kFirst;
      } else if (*scheme_name == "never") {
        scheme = PrependScheme::kNever;
      } else {
        return JsonError(JsonPath(path, "prepend_scheme"),
                         Concat("\"", *scheme_name, "\" is not supported"));
      }
    } else {
      // Files from before prepend_scheme existed say add_prefix_space instead.
      SCD_ASSIGN_OR_RETURN(const bool add_prefix_space,
                           GetBool(json, path, "add_prefix_space", true));
      if (!add_prefix_space) scheme = PrependScheme::kNever;
    }
    SCD_ASSIGN_OR_RETURN(const bool split, GetBool(json, path, "split", true));
    return std::make_unique<MetaspacePreTokenizer>(replacement, scheme, split);
  }
  if (type == "Whitespace") {
    SCD_ASSIGN_OR_RETURN(auto regex, Pattern::Regex(R"(\w+|[^\w\s]+)"));
    return std::make_unique<SplitPreTokenizer>(std::move(regex), Behavior::kRemoved, true);
  }
  if (type == "WhitespaceSplit") {
    return std::make_unique<CharSplitPreTokenizer>(IsWhiteSpace, Behavior::kRemoved);
  }
  if (type == "Digits") {
    SCD_ASSIGN_OR_RETURN(const bool individual, GetBool(json, path, "individual_digits", false));
    return std::make_unique<CharSplitPreTokenizer>(
        IsNumeric, individual ? Behavior::kIsolated : Behavior::kContiguous);
  }
  if (type == "Punctuation") {
    SCD_ASSIGN_OR_RETURN(const Behavior behavior, ParseBehavior(json, path, Behavior::kIsolated));
    return std::make_unique<CharSplitPreTokenizer>(IsPunctuation, behavior);
  }
  if (type == "BertPreTokenizer") {
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    steps.push_back(std::make_unique<CharSplitPreTokenizer>(IsWhiteSpace, Behavior::kRemoved));
    steps.push_back(std::make_unique<CharSplitPreTokenizer>(IsPunctuation, Behavior::kIsolated));
    return std::make_unique<SequencePreTokenizer>(std::move(steps));
  }
  return JsonError(JsonPath(path, "type"), Concat("\"", type, "\" is not supported"));
}

}  // namespace scd::tokenizer_internal
