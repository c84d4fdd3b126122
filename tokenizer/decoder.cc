#include "tokenizer/decoder.h"

#include <utility>

#include "base/status_macros.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace scd::tokenizer_internal {
namespace {

constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps)
      : steps_(std::move(steps)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (const auto& step : steps_) step->DecodeChain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(std::unique_ptr<Pattern> pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (std::string& token : *tokens) token = ReplaceAll(*pattern_, token, content_);
  }

 private:
  std::unique_ptr<Pattern> pattern_;
  std::string content_;
};

// Parses "<0xXX>" like HF: six bytes, and u8::from_str_radix on the two in the middle (which also
// accepts a leading '+', so "<0x+A>" is byte 10).
int ParseByteToken(std::string_view token) {
  if (token.size() != 6 || token.substr(0, 3) != "<0x" || token[5] != '>') return -1;
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  const int hi = hex(token[3]), lo = hex(token[4]);
  if (token[3] == '+' && lo >= 0) return lo;
  if (hi < 0 || lo < 0) return -1;
  return hi * 16 + lo;
}

class ByteFallbackDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens->size());
    std::string bytes;
    auto flush = [&] {
      if (bytes.empty()) return;
      if (IsValidUtf8(bytes)) {
        out.push_back(bytes);
      } else {
        // An invalid run becomes one U+FFFD per byte, not per maximal subpart.
        for (size_t i = 0; i < bytes.size(); ++i) out.emplace_back(kReplacementChar);
      }
      bytes.clear();
    };
    for (std::string& token : *tokens) {
      const int byte = ParseByteToken(token);
      if (byte >= 0) {
        bytes.push_back(static_cast<char>(byte));
      } else {
        flush();
        out.push_back(std::move(token));
      }
    }
    flush();
    *tokens = std::move(out);
  }
};

class FuseDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::string joined;
    for (const std::string& token : *tokens) joined += token;
    tokens->assign(1, std::move(joined));
  }
};

class StripDecoder : public Decoder {
 public:
  StripDecoder(char32_t content, size_t start, size_t stop)
      : content_(content), start_(start), stop_(stop) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (std::string& token : *tokens) {
      std::vector<size_t> offsets;  // char start offsets, plus the end
      std::vector<char32_t> chars;
      size_t pos = 0;
      while (pos < token.size()) {
        offsets.push_back(pos);
        chars.push_back(NextCodePoint(token, &pos));
      }
      offsets.push_back(token.size());
      size_t start_cut = 0;
      for (size_t i = 0; i < start_ && i < chars.size() && chars[i] == content_; ++i) {
        start_cut = i + 1;
      }
      size_t stop_cut = chars.size();
      for (size_t i = 0; i < stop_ && i < chars.size(); ++i) {
        const size_t index = chars.size() - i - 1;
        if (chars[index] != content_) break;
        stop_cut = index;
      }
      // HF would panic when the cuts cross; an empty token is the sensible result.
      if (stop_cut <= start_cut) {
        token.clear();
      } else {
        token = token.substr(offsets[start_cut], offsets[stop_cut] - offsets[start_cut]);
      }
    }
  }

 private:
  char32_t content_;
  size_t start_;
  size_t stop_;
};

class ByteLevelDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::string bytes;
    for (const std::string& token : *tokens) {
      const size_t mark = bytes.size();
      bool mapped = true;
      size_t pos = 0;
      while (pos < token.size()) {
        const int byte = UnicodeToByte(NextCodePoint(token, &pos));
        if (byte < 0) {
          mapped = false;
          break;
        }
        bytes.push_back(static_cast<char>(byte));
      }
      // A token with any character outside the byte map (an added token) contributes its UTF-8.
      if (!mapped) {
        bytes.resize(mark);
        bytes += token;
      }
    }
    tokens->assign(1, FromUtf8Lossy(bytes));
  }
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(char32_t replacement, bool strip_first)
      : replacement_(replacement), strip_first_(strip_first) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (size_t i = 0; i < tokens->size(); ++i) {
      std::string& token = (*tokens)[i];
      std::string out;
      out.reserve(token.size());
      size_t pos = 0;
      while (pos < token.size()) {
        const size_t start = pos;
        const char32_t c = NextCodePoint(token, &pos);
        if (c != replacement_) {
          out.append(token, start, pos - start);
        } else if (i != 0 || !strip_first_) {
          out.push_back(' ');
        }
      }
      token = std::move(out);
    }
  }

 private:
  char32_t replacement_;
  bool strip_first_;  // prepend_scheme != never: every replacement in the first token vanishes
};

class BpeDecoder : public Decoder {
 public:
  explicit BpeDecoder(std::string suffix) : suffix_(std::move(suffix)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (size_t i = 0; i < tokens->size(); ++i) {
      const std::string_view replacement = i + 1 == tokens->size() ? "" : " ";
      std::string& token = (*tokens)[i];
      std::string out;
      if (suffix_.empty()) {
        // Rust's str::replace with an empty pattern inserts around every character.
        size_t pos = 0;
        out.append(replacement);
        while (pos < token.size()) {
          const size_t start = pos;
          NextCodePoint(token, &pos);
          out.append(token, start, pos - start);
          out.append(replacement);
        }
      } else {
        size_t pos = 0;
        for (size_t hit; (hit = token.find(suffix_, pos)) != std::string::npos;
             pos = hit + suffix_.size()) {
          out.append(token, pos, hit - pos);
          out.append(replacement);
        }
        out.append(token, pos, std::string::npos);
      }
      token = std::move(out);
    }
  }

 private:
  std::string suffix_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const Json& json, std::string_view path) {
  SCD_ASSIGN_OR_RETURN(const std::string type, GetType(json, path));
  if (type == "Sequence") {
    SCD_ASSIGN_OR_RETURN(const Json* list, RequiredField(json, path, "decoders"));
    const std::string list_path = JsonPath(path, "decoders");
    if (!list->is_array()) return JsonError(list_path, "must be an array");
    std::vector<std::unique_ptr<Decoder>> steps;
    for (size_t i = 0; i < list->size(); ++i) {
      SCD_ASSIGN_OR_RETURN(auto step, ParseDecoder((*list)[i], Concat(list_path, "[", i, "]")));
      steps.push_back(std::move(step));
    }
    return std::make_unique<SequenceDecoder>(std::move(steps));
  }
  if (type == "Replace") {
    SCD_ASSIGN_OR_RETURN(const Json* pattern_json, RequiredField(json, path, "pattern"));
    SCD_ASSIGN_OR_RETURN(auto pattern, ParsePattern(*pattern_json, JsonPath(path, "pattern")));
    SCD_ASSIGN_OR_RETURN(std::string content, GetString(json, path, "content"));
    return std::make_unique<ReplaceDecoder>(std::move(pattern), std::move(content));
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    SCD_ASSIGN_OR_RETURN(const char32_t content, GetChar(json, path, "content", U' '));
    SCD_ASSIGN_OR_RETURN(const int64_t start, GetInt(json, path, "start", 0));
    SCD_ASSIGN_OR_RETURN(const int64_t stop, GetInt(json, path, "stop", 0));
    if (start < 0 || stop < 0) return JsonError(path, "start and stop must be non-negative");
    return std::make_unique<StripDecoder>(content, static_cast<size_t>(start),
                                          static_cast<size_t>(stop));
  }
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Metaspace") {
    SCD_ASSIGN_OR_RETURN(const char32_t replacement, GetChar(json, path, "replacement", U'\u2581'));
    SCD_ASSIGN_OR_RETURN(auto scheme, GetOptionalString(json, path, "prepend_scheme"));
    bool strip_first = true;
    if (scheme.has_value()) {
      if (*scheme != "always" && *scheme != "first" && *scheme != "never") {
        return JsonError(JsonPath(path, "prepend_scheme"),
                         Concat("\"", *scheme, "\" is not supported"));
      }
      strip_first = *scheme != "never";
    } else {
      SCD_ASSIGN_OR_RETURN(strip_first, GetBool(json, path, "add_prefix_space", true));
    }
    return std::make_unique<MetaspaceDecoder>(replacement, strip_first);
  }
  if (type == "BPEDecoder") {
    SCD_ASSIGN_OR_RETURN(auto suffix, GetOptionalString(json, path, "suffix"));
    return std::make_unique<BpeDecoder>(suffix.value_or("</w>"));
  }
  return JsonError(JsonPath(path, "type"), Concat("\"", type, "\" is not supported"));
}

}  // namespace scd::tokenizer_internal
