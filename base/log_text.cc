#include "base/log_text.h"

#include <cstdint>
#include <cstdio>

namespace scd {

std::string ForLog(std::string_view text, size_t max_bytes) {
  const std::string_view shown = text.substr(0, max_bytes);
  std::string out;
  out.reserve(shown.size() + 16);
  for (const char c : shown) {
    const auto byte = static_cast<unsigned char>(c);
    switch (c) {
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      default:
        break;
    }
    if (byte < 0x20 || byte >= 0x7f) {
      char hex[5];
      std::snprintf(hex, sizeof(hex), "\\x%02x", byte);
      out += hex;
    } else {
      out += c;
    }
  }
  if (text.size() > shown.size()) {
    out += "...(+" + std::to_string(text.size() - shown.size()) + " bytes)";
  }
  return out;
}

bool IsPrintableAscii(std::string_view text) {
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x21 || byte > 0x7e) return false;
  }
  return true;
}

bool IsValidUtf8(std::string_view text, size_t* bad_offset) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char b = bytes[i];
    size_t length = 0;
    uint32_t code = 0, min = 0;
    if (b < 0x80) {
      ++i;
      continue;
    } else if ((b & 0xe0) == 0xc0) {
      length = 2, code = b & 0x1f, min = 0x80;
    } else if ((b & 0xf0) == 0xe0) {
      length = 3, code = b & 0x0f, min = 0x800;
    } else if ((b & 0xf8) == 0xf0) {
      length = 4, code = b & 0x07, min = 0x10000;
    } else {
      break;
    }
    if (i + length > n) break;
    bool ok = true;
    for (size_t k = 1; k < length; ++k) {
      if ((bytes[i + k] & 0xc0) != 0x80) {
        ok = false;
        break;
      }
      code = (code << 6) | (bytes[i + k] & 0x3f);
    }
    if (!ok || code < min || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff)) break;
    i += length;
  }
  if (i == n) return true;
  if (bad_offset != nullptr) *bad_offset = i;
  return false;
}

}  // namespace scd
