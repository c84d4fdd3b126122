#include "base/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace scd {
namespace {

constexpr uint32_t kPolynomial = 0x82F63B78u;  // reflected Castagnoli

std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPolynomial : c >> 1;
    table[i] = c;
  }
  return table;
}

// Multiplication modulo the polynomial in the reflected domain (bit 31 is x^0): what shifting a
// CRC register across zero bytes amounts to.
uint32_t MultiplyModP(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (uint32_t m = 1u << 31; m != 0; m >>= 1) {
    if (a & m) product ^= b;
    b = (b & 1) ? (b >> 1) ^ kPolynomial : b >> 1;
  }
  return product;
}

// x^(8 * bytes) mod P: the factor that moves a CRC register past `bytes` zero bytes.
uint32_t ShiftFactor(uint64_t bytes) {
  uint32_t result = 1u << 31, power = 1u << 30;  // x^0, x^1
  for (uint64_t e = 8 * bytes; e != 0; e >>= 1) {
    if (e & 1) result = MultiplyModP(result, power);
    power = MultiplyModP(power, power);
  }
  return result;
}

bool DetectHardware() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("sse4.2");
#else
  return false;
#endif
}

}  // namespace

uint32_t Crc32cSoftware(const void* data, size_t size, uint32_t crc) {
  static const std::array<uint32_t, 256> table = MakeTable();
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  for (size_t i = 0; i < size; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

#if defined(__x86_64__)
// Not instrumented by AddressSanitizer (`make asan`): it reads exactly [data, data + size), and an
// instrumented CRC is slow enough to distort the transport's timing tests.
__attribute__((target("sse4.2"), no_sanitize_address)) uint32_t Crc32cHardware(const void* data, size_t size,
                                                          uint32_t crc) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t c = ~crc;
  // Large inputs: three independent streams over consecutive lanes hide the instruction's 3-cycle
  // latency (about 3x one stream); the lanes' registers are then joined with the shift factor,
  // because the raw register is linear: crc(s, A B) = shift(crc(s, A), |B|) ^ crc(0, B).
  constexpr size_t kLane = 8192;
  static const uint32_t kLaneShift = ShiftFactor(kLane);
  for (; size >= 3 * kLane; size -= 3 * kLane, p += 3 * kLane) {
    uint64_t c0 = c, c1 = 0, c2 = 0;
    for (size_t i = 0; i < kLane; i += 8) {
      uint64_t w0, w1, w2;
      std::memcpy(&w0, p + i, 8);
      std::memcpy(&w1, p + kLane + i, 8);
      std::memcpy(&w2, p + 2 * kLane + i, 8);
      c0 = _mm_crc32_u64(c0, w0);
      c1 = _mm_crc32_u64(c1, w1);
      c2 = _mm_crc32_u64(c2, w2);
    }
    uint32_t joined = MultiplyModP(kLaneShift, static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c1);
    c = MultiplyModP(kLaneShift, joined) ^ static_cast<uint32_t>(c2);
  }
  for (; size >= 8; size -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);  // unaligned-safe
    c = _mm_crc32_u64(c, word);
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  for (; size > 0; --size, ++p) c32 = _mm_crc32_u8(c32, *p);
  return ~c32;
}
#else
uint32_t Crc32cHardware(const void* data, size_t size, uint32_t crc) {
  return Crc32cSoftware(data, size, crc);
}
#endif

bool Crc32cIsHardware() {
  static const bool hardware = DetectHardware();
  return hardware;
}

uint32_t Crc32c(const void* data, size_t size, uint32_t crc) {
  return Crc32cIsHardware() ? Crc32cHardware(data, size, crc) : Crc32cSoftware(data, size, crc);
}

}  // namespace scd
