// base/log_text.h: client text is escaped (no new line, no terminal control, no raw bytes above
// ASCII) and cut with the count of what was left out; the UTF-8 check against hand-made cases of
// every malformation (RFC 3629) and the request-id charset.
#include "base/log_text.h"

#include <gtest/gtest.h>

#include <string>

namespace scd {
namespace {

TEST(LogTextTest, EscapesEverythingThatCouldForgeOrColourALine) {
  EXPECT_EQ(ForLog("plain id-42"), "plain id-42");
  EXPECT_EQ(ForLog("a\nb\r\tc\\"), "a\\nb\\r\\tc\\\\");
  EXPECT_EQ(ForLog("x\n[error] fake\x1b[31m"), "x\\n[error] fake\\x1b[31m");
  EXPECT_EQ(ForLog(std::string("\0\x7f", 2)), "\\x00\\x7f");
  EXPECT_EQ(ForLog("caf\xc3\xa9"), "caf\\xc3\\xa9");
  const std::string shown = ForLog("x\ny");
  EXPECT_EQ(shown.find('\n'), std::string::npos);
}

TEST(LogTextTest, CutsLongValuesSayingHowMuchWasLeftOut) {
  const std::string big(4 << 20, 'a');
  const std::string shown = ForLog(big);
  EXPECT_EQ(shown, std::string(kLogTextBytes, 'a') + "...(+" +
                       std::to_string(big.size() - kLogTextBytes) + " bytes)");
  EXPECT_EQ(ForLog("abcdef", 3), "abc...(+3 bytes)");
  EXPECT_EQ(ForLog("abc", 3), "abc");
  EXPECT_LE(ForLog(std::string(1000, '\x01'), 10).size(), 10u * 4 + 20);
}

TEST(LogTextTest, RequestIdCharsetIsPrintableAsciiWithoutSpaces) {
  EXPECT_TRUE(IsPrintableAscii("req-280_A.b~!"));
  EXPECT_TRUE(IsPrintableAscii(""));
  EXPECT_FALSE(IsPrintableAscii("has space"));
  EXPECT_FALSE(IsPrintableAscii("tab\t"));
  EXPECT_FALSE(IsPrintableAscii("del\x7f"));
  EXPECT_FALSE(IsPrintableAscii("caf\xc3\xa9"));
}

TEST(LogTextTest, Utf8ValidityFollowsRfc3629) {
  for (const char* good : {"", "ascii", "caf\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80",
                           "\xef\xbf\xbf", "\xf4\x8f\xbf\xbf", "\xed\x9f\xbf"}) {
    EXPECT_TRUE(IsValidUtf8(good)) << ForLog(good);
  }
  struct Bad {
    std::string text;
    size_t offset;
  };
  for (const Bad& bad : std::initializer_list<Bad>{
           {"ab\x80", 2},               // a lone continuation byte
           {"\xc3", 0},                 // cut short
           {"x\xe2\x82", 1},            // cut short
           {"\xc0\xaf", 0},             // overlong '/'
           {"\xe0\x80\xaf", 0},         // overlong, 3 bytes
           {"\xed\xa0\x80", 0},         // a surrogate (U+D800)
           {"\xf4\x90\x80\x80", 0},     // past U+10FFFF
           {"\xff", 0},                 // never valid
           {"ok\xc3(", 2},              // a bad continuation
       }) {
    size_t offset = 99;
    EXPECT_FALSE(IsValidUtf8(bad.text, &offset)) << ForLog(bad.text);
    EXPECT_EQ(offset, bad.offset) << ForLog(bad.text);
  }
}

}  // namespace
}  // namespace scd
