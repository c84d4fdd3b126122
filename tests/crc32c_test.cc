// base/crc32c.h against RFC 3720's test vectors; hardware == table; streaming == one shot.
#include "base/crc32c.h"

#include <gtest/gtest.h>

#include <cstring>
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
    // 24575 / 24576 / 24577 straddle the three-lane block of the hardware path, 22527 / 22528 /
    // 22529 and 45056 the fused path's block (three 2 KiB streams and 16 KiB folded).
    for (size_t n : {0, 1, 7, 8, 9, 63, 64, 65, 1000, 4990, 22527, 22528, 22529, 24575, 24576,
                     24577, 45056, 49160, 99000}) {
      const uint8_t* p = buffer.data() + offset;
      const uint32_t one_shot = Crc32cSoftware(p, n);
      if (Crc32cIsHardware()) {
        EXPECT_EQ(Crc32cHardware(p, n), one_shot) << offset << " " << n;
      }
      if (Crc32cIsFused()) {
        EXPECT_EQ(Crc32cFused(p, n), one_shot) << offset << " " << n;
      }
      EXPECT_EQ(Crc32c(p, n), one_shot);
      const size_t half = n / 3;
      EXPECT_EQ(Crc32c(p + half, n - half, Crc32c(p, half)), one_shot) << n;
    }
  }
}

// The fused copy: the destination holds exactly the source, and the CRC is the one-pass CRC,
// also when a copy is cut into pieces that extend each other's CRC (a chunk arriving in pieces).
TEST(Crc32cTest, CopyCopiesExactlyAndChecksumsAsItGoes) {
  std::mt19937 rng(8);
  std::vector<uint8_t> source(100000);
  for (auto& b : source) b = static_cast<uint8_t>(rng());
  for (size_t offset : {0, 1, 5}) {
    for (size_t n : {0, 1, 7, 8, 9, 24575, 24576, 24577, 99000}) {
      std::vector<uint8_t> dst(n + 16, 0xEE);
      const uint8_t* p = source.data() + offset;
      EXPECT_EQ(Crc32cCopy(dst.data() + 3, p, n), Crc32cSoftware(p, n)) << offset << " " << n;
      EXPECT_EQ(std::memcmp(dst.data() + 3, p, n), 0);
      EXPECT_EQ(dst[2], 0xEE);  // nothing written outside
      EXPECT_EQ(dst[n + 3], 0xEE);
      const size_t cut = n / 2;
      std::vector<uint8_t> pieces(n + 1);
      const uint32_t first = Crc32cCopy(pieces.data(), p, cut);
      EXPECT_EQ(Crc32cCopy(pieces.data() + cut, p + cut, n - cut, first), Crc32cSoftware(p, n));
    }
  }
}

}  // namespace
}  // namespace scd
