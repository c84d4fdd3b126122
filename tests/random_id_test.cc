// base/random_id.h: 32 hex digits, never repeated, every bit position set about half the time
// (a counter or a constant would fail all three).
#include "base/random_id.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace scd {
namespace {

TEST(RandomIdTest, HexDigitsNeverRepeatedAndBalanced) {
  std::set<std::string> seen;
  int ones[128] = {};
  const int n = 4000;
  for (int i = 0; i < n; ++i) {
    const std::string id = RandomId128();
    ASSERT_EQ(id.size(), 32u);
    for (size_t d = 0; d < 32; ++d) {
      const char c = id[d];
      ASSERT_TRUE((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')) << id;
      const int nibble = c <= '9' ? c - '0' : c - 'a' + 10;
      for (int b = 0; b < 4; ++b) ones[d * 4 + b] += (nibble >> b) & 1;
    }
    seen.insert(id);
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(n));
  // Binomial(4000, 1/2): sd 31.6; 6 sd either side over 128 positions fails ~never by chance.
  for (int bit = 0; bit < 128; ++bit) {
    EXPECT_NEAR(ones[bit], n / 2, 190) << "bit " << bit;
  }
}

}  // namespace
}  // namespace scd
