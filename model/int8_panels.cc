// Compiled with -ffp-contract=off (model/CMakeLists.txt): apart from the explicit fused
// multiply-add of the block sums (std::fma and _mm*_fmadd_ps, the same operation), every multiply
// and add stays its own rounding on every path, or the scalar and vector kernels would part in the
// last bit.
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

constexpr int64_t kGroupsPerBlock = kInt8Block / 4;  // groups of 4 k per block of x
// Register tiles: AVX-512 VNNI keeps kVnniRows x kVnniPanels int32 block sums and as many float32
// accumulators (24 of 32 registers); AVX2 one row of one panel.
constexpr int kVnniRows = 4, kVnniPanels = 3;

int32_t QuantizeOne(float v, float inv) {
  const float r = std::nearbyint(v * inv);
  return static_cast<int32_t>(std::min(127.0f, std::max(-127.0f, r)));
}

// One block of x (n <= kInt8Block values; the rest of the block is zero).
void QuantizeBlockScalar(const float* x, int64_t n, float* scale, int32_t* sum128, int8_t* s8,
                         int16_t* i16) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  *scale = amax / 127.0f;
  int32_t sum = 0;
  for (int64_t i = 0; i < kInt8Block; ++i) {
    const int32_t q = i < n ? QuantizeOne(x[i], inv) : 0;
    sum += q;
    if (s8 != nullptr) s8[i] = static_cast<int8_t>(q);
    if (i16 != nullptr) i16[i] = static_cast<int16_t>(q);
  }
  *sum128 = 128 * sum;
}

// The scalar kernel: exact int32 block sums, then the documented float steps.
void ScalarPanel(const PanelProduct& p, int64_t panel) {
  const uint8_t* w = p.w + panel * p.panel_bytes;
  for (int64_t m = 0; m < p.m; ++m) {
    const int16_t* x = p.x_i16 + m * p.x_stride;
    const float* scale = p.x_block_scale + m * p.x_blocks;
    for (int64_t c = 0; c < kPanelColumns; ++c) {
      const int64_t n = panel * kPanelColumns + c;
      if (n >= p.n) break;
      float acc = 0.0f;
      for (int64_t b = 0; b < p.x_blocks; ++b) {
        int32_t d = 0;
        for (int64_t g = b * kGroupsPerBlock; g < (b + 1) * kGroupsPerBlock; ++g) {
          const uint8_t* wg = w + g * kPanelGroupBytes + c * 4;
          for (int j = 0; j < 4; ++j) d += (static_cast<int32_t>(wg[j]) - 128) * x[4 * g + j];
        }
        acc = std::fma(static_cast<float>(d), scale[b], acc);
      }
      float r = acc * p.w_scale[n];
      if (p.bias != nullptr) r = r + p.bias[n];
      p.y[m * p.y_stride + n - p.y_first] = r;
    }
  }
}

#if defined(__x86_64__)
#define SCD_VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
#define SCD_AVX2_TARGET __attribute__((target("avx2,fma,f16c")))

// A block of 32 with AVX2 where the CPU has it: the same values as QuantizeBlockScalar (max is
// exact; x * inv and the rounding to nearest even are the same operations).
SCD_AVX2_TARGET void QuantizeBlockAvx2(const float* x, float* scale, int32_t* sum128, int8_t* s8,
                                       int16_t* i16) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 v[4], m = _mm256_setzero_ps();
  for (int q = 0; q < 4; ++q) {
    v[q] = _mm256_loadu_ps(x + 8 * q);
    m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[q]));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float amax = 0.0f;
  for (float l : lanes) amax = std::max(amax, l);
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  *scale = amax / 127.0f;
  const __m256 vinv = _mm256_set1_ps(inv), hi = _mm256_set1_ps(127.0f),
               lo = _mm256_set1_ps(-127.0f);
  alignas(32) int32_t q32[kInt8Block];
  for (int q = 0; q < 4; ++q) {
    __m256 r =
        _mm256_round_ps(_mm256_mul_ps(v[q], vinv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm256_min_ps(hi, _mm256_max_ps(lo, r));
    _mm256_store_si256(reinterpret_cast<__m256i*>(q32 + 8 * q), _mm256_cvtps_epi32(r));
  }
  int32_t sum = 0;
  for (int64_t i = 0; i < kInt8Block; ++i) {
    sum += q32[i];
    if (s8 != nullptr) s8[i] = static_cast<int8_t>(q32[i]);
    if (i16 != nullptr) i16[i] = static_cast<int16_t>(q32[i]);
  }
  *sum128 = 128 * sum;
}

// Rows [m0, m0 + MR) against panels [panel, panel + NP): per block of x, int32 sums of 8 groups
// in registers, then folded into float32 accumulators (all of them in registers through the k
// loop: every loop over rows and panels unrolled, the results stored once for the epilogue).
template <int MR, int NP>
SCD_VNNI_TARGET void VnniTile(const PanelProduct& p, int64_t m0, int64_t panel) {
  __m512 acc[MR][NP];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NP; ++j) acc[i][j] = _mm512_setzero_ps();
  }
  const uint8_t* w = p.w + panel * p.panel_bytes;
  const int8_t* x = p.x_s8 + m0 * p.x_stride;
  for (int64_t b = 0; b < p.x_blocks; ++b) {
    __m512i dot[MR][NP];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
      for (int j = 0; j < NP; ++j) dot[i][j] = _mm512_setzero_si512();
    }
#pragma GCC unroll 8
    for (int64_t g = b * kGroupsPerBlock; g < (b + 1) * kGroupsPerBlock; ++g) {
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
        for (int j = 0; j < NP; ++j) dot[i][j] = _mm512_dpbusd_epi32(dot[i][j], wv[j], xb);
      }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512i offset = _mm512_set1_epi32(p.x_block_sum128[(m0 + i) * p.x_blocks + b]);
      const __m512 scale = _mm512_set1_ps(p.x_block_scale[(m0 + i) * p.x_blocks + b]);
#pragma GCC unroll 8
      for (int j = 0; j < NP; ++j) {
        // (The masked form: GCC 12 warns that _mm512_cvtepi32_ps's undefined source is
        // uninitialized.)
        const __m512 d = _mm512_mask_cvtepi32_ps(_mm512_setzero_ps(), 0xFFFF,
                                                 _mm512_sub_epi32(dot[i][j], offset));
        acc[i][j] = _mm512_fmadd_ps(d, scale, acc[i][j]);
      }
    }
  }
  alignas(64) float sums[MR][NP][kPanelColumns];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NP; ++j) _mm512_store_ps(sums[i][j], acc[i][j]);
  }
  for (int j = 0; j < NP; ++j) {
    const int64_t n0 = (panel + j) * kPanelColumns;
    const int64_t valid = std::min<int64_t>(kPanelColumns, p.n - n0);
    const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1);
    const __m512 w_scale = _mm512_loadu_ps(p.w_scale + n0);
    const __m512 bias =
        p.bias != nullptr ? _mm512_maskz_loadu_ps(mask, p.bias + n0) : _mm512_setzero_ps();
    for (int i = 0; i < MR; ++i) {
      __m512 r = _mm512_mul_ps(_mm512_load_ps(sums[i][j]), w_scale);
      if (p.bias != nullptr) r = _mm512_add_ps(r, bias);
      _mm512_mask_storeu_ps(p.y + (m0 + i) * p.y_stride + n0 - p.y_first, mask, r);
    }
  }
}

template <int MR>
constexpr PanelTile kVnniByPanels[kVnniPanels] = {VnniTile<MR, 1>, VnniTile<MR, 2>,
                                                  VnniTile<MR, 3>};
constexpr const PanelTile* kVnniTiles[kVnniRows] = {kVnniByPanels<1>, kVnniByPanels<2>,
                                                    kVnniByPanels<3>, kVnniByPanels<4>};

// Eight int32 lanes [c0 k01, c0 k23, c1 k01, ...] of two accumulators -> columns c0..c7 in order.
SCD_AVX2_TARGET inline __m256i JoinPairs(__m256i a, __m256i b) {
  return _mm256_permute4x64_epi64(_mm256_hadd_epi32(a, b), 0xD8);
}

// One row of x against one panel with vpmaddwd on int16.
SCD_AVX2_TARGET void Avx2Row(const PanelProduct& p, int64_t m, int64_t panel) {
  __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};  // columns 0-7, 8-15
  const uint8_t* w = p.w + panel * p.panel_bytes;
  const int16_t* x = p.x_i16 + m * p.x_stride;
  const __m128i flip = _mm_set1_epi8(static_cast<char>(0x80));  // q + 128 -> q
  for (int64_t b = 0; b < p.x_blocks; ++b) {
    __m256i dot[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                      _mm256_setzero_si256()};
    for (int64_t g = b * kGroupsPerBlock; g < (b + 1) * kGroupsPerBlock; ++g) {
      int64_t xi;
      std::memcpy(&xi, x + 4 * g, 8);
      const __m256i xb = _mm256_set1_epi64x(xi);
      for (int q = 0; q < 4; ++q) {  // four columns x four k each, as int16
        const __m128i raw =
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + g * kPanelGroupBytes + 16 * q));
        const __m256i wq = _mm256_cvtepi8_epi16(_mm_xor_si128(raw, flip));
        dot[q] = _mm256_add_epi32(dot[q], _mm256_madd_epi16(wq, xb));
      }
    }
    const __m256 scale = _mm256_set1_ps(p.x_block_scale[m * p.x_blocks + b]);
    for (int h = 0; h < 2; ++h) {
      const __m256 d = _mm256_cvtepi32_ps(JoinPairs(dot[2 * h], dot[2 * h + 1]));
      acc[h] = _mm256_fmadd_ps(d, scale, acc[h]);
    }
  }
  for (int h = 0; h < 2; ++h) {
    const int64_t n0 = panel * kPanelColumns + 8 * h;
    if (n0 >= p.n) break;
    alignas(32) float r[8];
    _mm256_store_ps(r, acc[h]);
    float* y = p.y + m * p.y_stride;
    for (int64_t c = 0; c < 8 && n0 + c < p.n; ++c) {
      const float v = r[c] * p.w_scale[n0 + c];
      y[n0 + c - p.y_first] = p.bias != nullptr ? v + p.bias[n0 + c] : v;
    }
  }
}
#endif  // __x86_64__

}  // namespace

void QuantizeInt8Rows(const float* x, int64_t m, int64_t k, int64_t in_stride, int64_t out_stride,
                      float* scale, int32_t* sum128, int8_t* s8, int16_t* i16) {
  const int64_t blocks = out_stride / kInt8Block;
#if defined(__x86_64__)
  const bool avx2 = RunnableKernelIsa().avx2;
#endif
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t at = b * kInt8Block, n = std::max<int64_t>(0, std::min(kInt8Block, k - at));
      const float* src = x + r * in_stride + at;
      int8_t* out8 = s8 == nullptr ? nullptr : s8 + r * out_stride + at;
      int16_t* out16 = i16 == nullptr ? nullptr : i16 + r * out_stride + at;
      float* sc = scale + r * blocks + b;
      int32_t* sum = sum128 + r * blocks + b;
#if defined(__x86_64__)
      if (avx2 && n == kInt8Block) {
        QuantizeBlockAvx2(src, sc, sum, out8, out16);
        continue;
      }
#endif
      QuantizeBlockScalar(src, n, sc, sum, out8, out16);
    }
  }
}

int64_t Int8PanelsPerItem(Int8Kernel kernel) {
  return kernel == Int8Kernel::kAvx512Vnni ? kVnniPanels : 1;
}

void Int8Panels(Int8Kernel kernel, const PanelProduct& p, int64_t p0, int64_t p1) {
#if defined(__x86_64__)
  if (kernel == Int8Kernel::kAvx512Vnni) {
    ForEachTile(p, p0, p1, kVnniTiles, kVnniRows, kVnniPanels);
    return;
  }
  if (kernel == Int8Kernel::kAvx2) {
    for (int64_t panel = p0; panel < p1; ++panel) {
      for (int64_t m = 0; m < p.m; ++m) Avx2Row(p, m, panel);
    }
    return;
  }
#endif
  for (int64_t panel = p0; panel < p1; ++panel) ScalarPanel(p, panel);
}

}  // namespace scd
