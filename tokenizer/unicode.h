// UTF-8 and Unicode helpers shared by the tokenizer components: code point iteration, Rust-style
// lossy decoding, character classes with the exact definitions the HF `tokenizers` library uses,
// and the GPT-2 byte <-> unicode map.
//
// Thread-safety: all functions are pure or read immutable tables; safe from any thread.
#ifndef SCD_TOKENIZER_UNICODE_H_
#define SCD_TOKENIZER_UNICODE_H_

#include <array>
#include <cstddef>
#include <string>
#include <string_view>

namespace scd::tokenizer_internal {

// Decodes the code point starting at `*pos` and advances `*pos` past it.
// REQUIRES: `s` is valid UTF-8 and `*pos` is at a character boundary before the end.
char32_t NextCodePoint(std::string_view s, size_t* pos);

// Appends the UTF-8 encoding of `cp` to `out`.
void AppendUtf8(char32_t cp, std::string* out);

// True if `s` is well-formed UTF-8 (no surrogates, no overlongs, nothing above U+10FFFF).
bool IsValidUtf8(std::string_view s);

// Byte offset of the first ill-formed sequence in `s`, or s.size() if it is all valid.
size_t FirstInvalidUtf8(std::string_view s);

// Rust's String::from_utf8_lossy: each maximal ill-formed subpart becomes one U+FFFD.
std::string FromUtf8Lossy(std::string_view bytes);

// Length of the longest prefix of `s` that ends at a complete character (used to avoid emitting
// half a character while streaming). Bytes that can never start a valid character count as
// complete so that they are not held back forever.
size_t CompleteUtf8Prefix(std::string_view s);

// Unicode White_Space (Rust char::is_whitespace, regex `\s`, Oniguruma `\s`).
bool IsWhiteSpace(char32_t c);

// Rust regex `\w`: Alphabetic, marks, decimal digits, connector punctuation, joiners.
bool IsWordChar(char32_t c);

// Rust char::is_numeric: general categories Nd, Nl, No.
bool IsNumeric(char32_t c);

// HF's punctuation test: char::is_ascii_punctuation or a Unicode P* category.
bool IsPunctuation(char32_t c);

// Rust char::to_lowercase (full mapping), appended as UTF-8.
void AppendLowercase(char32_t c, std::string* out);

// GPT-2 bytes_to_unicode: the UTF-8 string of the printable character that stands for each byte.
const std::array<std::string, 256>& ByteToUnicode();

// Inverse of ByteToUnicode for one character: the byte, or -1 if `c` stands for no byte.
int UnicodeToByte(char32_t c);

}  // namespace scd::tokenizer_internal

#endif  // SCD_TOKENIZER_UNICODE_H_
