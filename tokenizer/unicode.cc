#include "tokenizer/unicode.h"

#include <utf8proc.h>

namespace scd::tokenizer_internal {
namespace {

// Outcome of scanning one sequence at a position (Unicode Table 3-7, well-formed byte sequences).
struct Scan {
  size_t length;   // bytes consumed: the whole character, or the maximal ill-formed subpart
  bool valid;      // a complete well-formed character
  bool truncated;  // ill-formed only because the input ended early
};

Scan ScanOne(std::string_view s, size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return {1, true, false};
  size_t width = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    width = 2;
  } else if (b0 == 0xE0) {
    width = 3, lo = 0xA0;
  } else if ((b0 >= 0xE1 && b0 <= 0xEC) || b0 == 0xEE || b0 == 0xEF) {
    width = 3;
  } else if (b0 == 0xED) {
    width = 3, hi = 0x9F;
  } else if (b0 == 0xF0) {
    width = 4, lo = 0x90;
  } else if (b0 >= 0xF1 && b0 <= 0xF3) {
    width = 4;
  } else if (b0 == 0xF4) {
    width = 4, hi = 0x8F;
  } else {
    return {1, false, false};
  }
  size_t j = i + 1;
  for (size_t k = 1; k < width; ++k, ++j) {
    if (j >= s.size()) return {j - i, false, true};
    const auto b = static_cast<unsigned char>(s[j]);
    if (b < lo || b > hi) return {j - i, false, false};
    lo = 0x80, hi = 0xBF;
  }
  return {width, true, false};
}

}  // namespace

char32_t NextCodePoint(std::string_view s, size_t* pos) {
  size_t i = *pos;
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    *pos = i + 1;
    return b0;
  }
  int extra = b0 >= 0xF0 ? 3 : b0 >= 0xE0 ? 2 : 1;
  char32_t cp = b0 & (0x3F >> extra);
  for (int k = 1; k <= extra; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  *pos = i + 1 + extra;
  return cp;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t FirstInvalidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const Scan scan = ScanOne(s, i);
    if (!scan.valid) return i;
    i += scan.length;
  }
  return s.size();
}

bool IsValidUtf8(std::string_view s) { return FirstInvalidUtf8(s) == s.size(); }

std::string FromUtf8Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    const Scan scan = ScanOne(bytes, i);
    if (scan.valid) {
      out.append(bytes.substr(i, scan.length));
    } else {
      out.append("\xEF\xBF\xBD");
    }
    i += scan.length;
  }
  return out;
}

size_t CompleteUtf8Prefix(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const Scan scan = ScanOne(s, i);
    if (scan.truncated) return i;
    i += scan.length;
  }
  return s.size();
}

bool IsWhiteSpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

bool IsWordChar(char32_t c) {
  if (c < 0x80) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  }
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      // Join_Control and the Other_Alphabetic symbols (circled / squared Latin letters).
      return c == 0x200C || c == 0x200D || (c >= 0x24B6 && c <= 0x24E9) ||
             (c >= 0x1F130 && c <= 0x1F149) || (c >= 0x1F150 && c <= 0x1F169) ||
             (c >= 0x1F170 && c <= 0x1F189);
  }
}

bool IsNumeric(char32_t c) {
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
}

bool IsPunctuation(char32_t c) {
  if (c < 0x80) {
    return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
           (c >= 0x7B && c <= 0x7E);
  }
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat >= UTF8PROC_CATEGORY_PC && cat <= UTF8PROC_CATEGORY_PO;
}

void AppendLowercase(char32_t c, std::string* out) {
  // The only unconditional multi-character lowercase mapping in SpecialCasing.txt.
  if (c == 0x130) {
    out->append("i\xCC\x87");
    return;
  }
  AppendUtf8(static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))), out);
}

namespace {

struct ByteTables {
  std::array<std::string, 256> to_unicode;
  std::array<int, 324> to_byte;  // indexed by code point; every mapped char is below U+0144
};

const ByteTables& Tables() {
  static const ByteTables* tables = [] {
    auto* t = new ByteTables();
    t->to_byte.fill(-1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const int cp = printable ? b : next++;
      AppendUtf8(static_cast<char32_t>(cp), &t->to_unicode[b]);
      t->to_byte[cp] = b;
    }
    return t;
  }();
  return *tables;
}

}  // namespace

const std::array<std::string, 256>& ByteToUnicode() { return Tables().to_unicode; }

int UnicodeToByte(char32_t c) { return c < Tables().to_byte.size() ? Tables().to_byte[c] : -1; }

}  // namespace scd::tokenizer_internal
