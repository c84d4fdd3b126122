// Text that came from outside (a client's request id, target name, prompt, stop string; a peer's
// message) made safe to put in a log line or an error message: every byte outside printable ASCII
// and the backslash is escaped (\n, \t, \x1b, ...), so nothing can start a new log line, move the
// cursor or colour the terminal; and it is cut at a bound, saying how much was left out, so one
// request cannot fill the log or outgrow gRPC's metadata limit in an error it provoked.
// Thread-safety: stateless functions.
#ifndef SCD_BASE_LOG_TEXT_H_
#define SCD_BASE_LOG_TEXT_H_

#include <cstddef>
#include <string>
#include <string_view>

namespace scd {

// The default bound on how many input bytes of one value reach a log line.
inline constexpr size_t kLogTextBytes = 96;

// `text` escaped, at most `max_bytes` of its bytes shown, then "...(+N bytes)" when cut.
std::string ForLog(std::string_view text, size_t max_bytes = kLogTextBytes);

// True when every byte of `text` is printable ASCII (0x21..0x7e), the charset of request ids.
bool IsPrintableAscii(std::string_view text);

// True when `text` is well-formed UTF-8 (no overlong forms, surrogates or code points past
// U+10FFFF). `*bad_offset`, when given and the text is not, is the first bad byte's offset.
bool IsValidUtf8(std::string_view text, size_t* bad_offset = nullptr);

}  // namespace scd

#endif  // SCD_BASE_LOG_TEXT_H_
