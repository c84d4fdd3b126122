// base/crc32c.h against RFC 3720's test vectors; hardware == table; streaming == one shot.
#include "base/crc32c.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace scd {
namespace {

TEST(Crc32cTest, Rfc3720Vectors) {
  const std::string zeros(32, '\0'), ones(32, '\xff');
  std::string ascending, descending;
  for (int i = 0; i < 32; ++i) {
    ascending.push_back(static_cast<char>(i));
    descending.push_back(static_cast<char>(31 - i));
  }
  for (auto f : {&Crc32cSoftware, &Crc32c}) {
    EXPECT_EQ(f(zeros.data(), zeros.size(), 0), 0x8A9136AAu);
    EXPECT_EQ(f(ones.data(), ones.size(), 0), 0x62A8AB43u);
    EXPECT_EQ(f(ascending.data(), ascending.size(), 0), 0x46DD794Eu);
    EXPECT_EQ(f(descending.data(), descending.size(), 0), 0x113FDB5Cu);
    EXPECT_EQ(f("123456789", 9, 0), 0xE3069283u);
  }
}

TEST(Crc32cTest, HardwareEqualsTableAndStreamingEqualsOneShot) {
  std::mt19937 rng(7);
  std::vector<uint8_t> buffer(100000);
  for (auto& b : buffer) b = static_cast<uint8_t>(rng());
  for (size_t offset : {0, 1, 3, 7}) {
    // 24575 / 24576 / 24577 straddle the three-lane block of the hardware path.
    for (size_t n : {0, 1, 7, 8, 9, 63, 64, 65, 1000, 4990, 24575, 24576, 24577, 49160, 99000}) {
      const uint8_t* p = buffer.data() + offset;
      const uint32_t one_shot = Crc32cSoftware(p, n);
      if (Crc32cIsHardware()) {
        EXPECT_EQ(Crc32cHardware(p, n), one_shot) << offset << " " << n;
      }
      EXPECT_EQ(Crc32c(p, n), one_shot);
      const size_t half = n / 3;
      EXPECT_EQ(Crc32c(p + half, n - half, Crc32c(p, half)), one_shot) << n;
    }
  }
}

}  // namespace
}  // namespace scd
