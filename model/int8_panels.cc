// Compiled with -ffp-contract=off (model/CMakeLists.txt): the epilogue's multiply and add must stay
// two roundings on every path, or the scalar and vector kernels would part in the last bit.
#include "model/int8_panels.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/cpu_simd.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace scd {
namespace {

// Register tiles: AVX-512 VNNI keeps kVnniRows x kVnniPanels accumulators (24 of 32 registers),
// AVX2 two rows x one panel (8 of 16).
constexpr int kVnniRows = 6, kVnniPanels = 4;
constexpr int kAvx2Rows = 2;

float RowAbsMax(const float* x, int64_t k) {
  float amax = 0.0f;
  for (int64_t i = 0; i < k; ++i) amax = std::max(amax, std::fabs(x[i]));
  return amax;
}

int32_t QuantizeOne(float v, float inv) {
  const float r = std::nearbyint(v * inv);
  return static_cast<int32_t>(std::min(127.0f, std::max(-127.0f, r)));
}

void QuantizeRowScalar(const float* x, int64_t k, float inv, uint8_t* u8, int16_t* i16) {
  for (int64_t i = 0; i < k; ++i) {
    const int32_t q = QuantizeOne(x[i], inv);
    if (u8 != nullptr) u8[i] = static_cast<uint8_t>(q + 128);
    if (i16 != nullptr) i16[i] = static_cast<int16_t>(q);
  }
}

// The scalar kernel: exact int32 dot products, then the shared epilogue.
float Epilogue(int32_t dot, float x_scale, float w_scale, const float* bias, int64_t n) {
  const float s = x_scale * w_scale;
  float r = static_cast<float>(dot) * s;
  if (bias != nullptr) r = r + bias[n];
  return r;
}

void ScalarPanel(const PanelProduct& p, int64_t panel) {
  const int8_t* w = reinterpret_cast<const int8_t*>(p.w + panel * p.panel_bytes);
  for (int64_t m = 0; m < p.m; ++m) {
    const int16_t* x = p.x_i16 + m * p.x_stride;
    for (int64_t c = 0; c < kPanelColumns; ++c) {
      const int64_t n = panel * kPanelColumns + c;
      if (n >= p.n) break;
      int32_t dot = 0;
      for (int64_t g = 0; g < p.groups; ++g) {
        const int8_t* wg = w + g * kPanelGroupBytes + c * 4;
        for (int j = 0; j < 4; ++j) dot += static_cast<int32_t>(wg[j]) * x[4 * g + j];
      }
      p.y[m * p.y_stride + n - p.y_first] = Epilogue(dot, p.x_scale[m], p.w_scale[n], p.bias, n);
    }
  }
}

#if defined(__x86_64__)
#define SCD_VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
#define SCD_AVX2_TARGET __attribute__((target("avx2,fma,f16c")))

SCD_AVX2_TARGET void QuantizeRowAvx2(const float* x, int64_t k, float inv, uint8_t* u8,
                                     int16_t* i16) {
  const __m256 vinv = _mm256_set1_ps(inv), hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    __m256 r = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vinv),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm256_min_ps(hi, _mm256_max_ps(lo, r));
    alignas(32) int32_t q[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(q), _mm256_cvtps_epi32(r));
    for (int j = 0; j < 8; ++j) {
      if (u8 != nullptr) u8[i + j] = static_cast<uint8_t>(q[j] + 128);
      if (i16 != nullptr) i16[i + j] = static_cast<int16_t>(q[j]);
    }
  }
  QuantizeRowScalar(x + i, k - i, inv, u8 == nullptr ? nullptr : u8 + i,
                    i16 == nullptr ? nullptr : i16 + i);
}

SCD_AVX2_TARGET float RowAbsMaxAvx2(const float* x, int64_t k) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 m = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float amax = RowAbsMax(x + i, k - i);
  for (float v : lanes) amax = std::max(amax, v);
  return amax;
}

// Rows [m0, m0 + MR) against panels [panel, panel + NP). The accumulators live in registers
// through the k loop (fully unrolled over rows and panels) and are stored once for the epilogue:
// indexed by run-time values there, GCC otherwise keeps them in memory on every step.
template <int MR, int NP>
SCD_VNNI_TARGET void VnniTile(const PanelProduct& p, int64_t m0, int64_t panel) {
  __m512i acc[MR][NP];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NP; ++j) acc[i][j] = _mm512_setzero_si512();
  }
  const uint8_t* w = p.w + panel * p.panel_bytes;
  const uint8_t* x = p.x_u8 + m0 * p.x_stride;
  for (int64_t g = 0; g < p.groups; ++g) {
    __m512i wv[NP];
#pragma GCC unroll 8
    for (int j = 0; j < NP; ++j) {
      wv[j] = _mm512_loadu_si512(w + j * p.panel_bytes + g * kPanelGroupBytes);
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      int32_t xi;
      std::memcpy(&xi, x + i * p.x_stride + 4 * g, 4);
      const __m512i xb = _mm512_set1_epi32(xi);
#pragma GCC unroll 8
      for (int j = 0; j < NP; ++j) acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], xb, wv[j]);
    }
  }
  alignas(64) int32_t sums[MR][NP][kPanelColumns];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NP; ++j) _mm512_store_si512(sums[i][j], acc[i][j]);
  }
  for (int j = 0; j < NP; ++j) {
    const int64_t n0 = (panel + j) * kPanelColumns;
    const int64_t valid = std::min<int64_t>(kPanelColumns, p.n - n0);
    const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1);
    const __m512i offset = _mm512_loadu_si512(p.w_offset + n0);
    const __m512 w_scale = _mm512_loadu_ps(p.w_scale + n0);
    const __m512 bias =
        p.bias != nullptr ? _mm512_maskz_loadu_ps(mask, p.bias + n0) : _mm512_setzero_ps();
    for (int i = 0; i < MR; ++i) {
      // (The masked form: GCC 12 warns that _mm512_cvtepi32_ps's undefined source is uninitialized.)
      const __m512 f = _mm512_mask_cvtepi32_ps(
          _mm512_setzero_ps(), 0xFFFF, _mm512_sub_epi32(_mm512_load_si512(sums[i][j]), offset));
      const __m512 s = _mm512_mul_ps(_mm512_set1_ps(p.x_scale[m0 + i]), w_scale);
      __m512 r = _mm512_mul_ps(f, s);
      if (p.bias != nullptr) r = _mm512_add_ps(r, bias);
      _mm512_mask_storeu_ps(p.y + (m0 + i) * p.y_stride + n0 - p.y_first, mask, r);
    }
  }
}

using TileFn = void (*)(const PanelProduct&, int64_t, int64_t);

template <int MR>
constexpr TileFn kVnniByPanels[kVnniPanels] = {VnniTile<MR, 1>, VnniTile<MR, 2>, VnniTile<MR, 3>,
                                               VnniTile<MR, 4>};
constexpr const TileFn* kVnniTiles[kVnniRows] = {kVnniByPanels<1>, kVnniByPanels<2>,
                                                 kVnniByPanels<3>, kVnniByPanels<4>,
                                                 kVnniByPanels<5>, kVnniByPanels<6>};

// Eight int32 lanes [c0 k01, c0 k23, c1 k01, ...] of two accumulators -> columns c0..c7 in order.
SCD_AVX2_TARGET inline __m256i JoinPairs(__m256i a, __m256i b) {
  return _mm256_permute4x64_epi64(_mm256_hadd_epi32(a, b), 0xD8);
}

template <int MR>
SCD_AVX2_TARGET void Avx2Tile(const PanelProduct& p, int64_t m0, int64_t panel) {
  __m256i acc[MR][4];
  for (int i = 0; i < MR; ++i) {
    for (int q = 0; q < 4; ++q) acc[i][q] = _mm256_setzero_si256();
  }
  const uint8_t* w = p.w + panel * p.panel_bytes;
  const int16_t* x = p.x_i16 + m0 * p.x_stride;
  for (int64_t g = 0; g < p.groups; ++g) {
    __m256i wv[4];  // four columns x four k each, as int16
    for (int q = 0; q < 4; ++q) {
      wv[q] = _mm256_cvtepi8_epi16(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + g * kPanelGroupBytes + 16 * q)));
    }
    for (int i = 0; i < MR; ++i) {
      int64_t xi;
      std::memcpy(&xi, x + i * p.x_stride + 4 * g, 8);
      const __m256i xb = _mm256_set1_epi64x(xi);
      for (int q = 0; q < 4; ++q) acc[i][q] = _mm256_add_epi32(acc[i][q], _mm256_madd_epi16(wv[q], xb));
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int h = 0; h < 2; ++h) {
      const int64_t n0 = panel * kPanelColumns + 8 * h;
      if (n0 >= p.n) break;
      const __m256 f = _mm256_cvtepi32_ps(JoinPairs(acc[i][2 * h], acc[i][2 * h + 1]));
      const __m256 s = _mm256_mul_ps(_mm256_set1_ps(p.x_scale[m0 + i]), _mm256_loadu_ps(p.w_scale + n0));
      alignas(32) float r[8];
      _mm256_store_ps(r, _mm256_mul_ps(f, s));
      float* y = p.y + (m0 + i) * p.y_stride;
      for (int64_t c = 0; c < 8 && n0 + c < p.n; ++c) {
        y[n0 + c - p.y_first] = p.bias != nullptr ? r[c] + p.bias[n0 + c] : r[c];
      }
    }
  }
}
#endif  // __x86_64__

}  // namespace

void QuantizeInt8Rows(const float* x, int64_t m, int64_t k, int64_t in_stride, int64_t out_stride,
                      float* scale, uint8_t* u8, int16_t* i16) {
  const bool avx2 = RunnableKernelIsa().avx2;
  for (int64_t r = 0; r < m; ++r) {
    const float* row = x + r * in_stride;
    uint8_t* ru8 = u8 == nullptr ? nullptr : u8 + r * out_stride;
    int16_t* ri16 = i16 == nullptr ? nullptr : i16 + r * out_stride;
#if defined(__x86_64__)
    const float amax = avx2 ? RowAbsMaxAvx2(row, k) : RowAbsMax(row, k);
#else
    const float amax = RowAbsMax(row, k);
#endif
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    scale[r] = amax / 127.0f;
#if defined(__x86_64__)
    if (avx2) {
      QuantizeRowAvx2(row, k, inv, ru8, ri16);
    } else {
      QuantizeRowScalar(row, k, inv, ru8, ri16);
    }
#else
    QuantizeRowScalar(row, k, inv, ru8, ri16);
#endif
    for (int64_t i = k; i < out_stride; ++i) {
      if (ru8 != nullptr) ru8[i] = 128;
      if (ri16 != nullptr) ri16[i] = 0;
    }
  }
}

int64_t Int8PanelsPerItem(Int8Kernel kernel) {
  return kernel == Int8Kernel::kAvx512Vnni ? kVnniPanels : 1;
}

void Int8Panels(Int8Kernel kernel, const PanelProduct& p, int64_t p0, int64_t p1) {
#if defined(__x86_64__)
  if (kernel == Int8Kernel::kAvx512Vnni) {
    // One row of x: one panel at a time, consecutive panels one sequential stream.
    const int64_t step = p.m == 1 ? 1 : kVnniPanels;
    for (int64_t panel = p0; panel < p1; panel += step) {
      const int64_t np = std::min<int64_t>(step, p1 - panel);
      for (int64_t m0 = 0; m0 < p.m; m0 += kVnniRows) {
        const int64_t mr = std::min<int64_t>(kVnniRows, p.m - m0);
        kVnniTiles[mr - 1][np - 1](p, m0, panel);
      }
    }
    return;
  }
  if (kernel == Int8Kernel::kAvx2) {
    for (int64_t panel = p0; panel < p1; ++panel) {
      int64_t m0 = 0;
      for (; m0 + kAvx2Rows <= p.m; m0 += kAvx2Rows) Avx2Tile<kAvx2Rows>(p, m0, panel);
      if (m0 < p.m) Avx2Tile<1>(p, m0, panel);
    }
    return;
  }
#endif
  for (int64_t panel = p0; panel < p1; ++panel) ScalarPanel(p, panel);
}

}  // namespace scd
