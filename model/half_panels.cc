#include "model/half_panels.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstring>

#include "model/cpu_simd.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace scd {
namespace {

// Register tiles: AVX-512 BF16 keeps kBf16Rows x kBf16Panels accumulators (24 of 32 registers);
// AVX2 two rows x one panel (8 of 16).
constexpr int kBf16Rows = 6, kBf16Panels = 4;
constexpr int kAvx2Rows = 2;

float WeightToFloat(HalfKind kind, uint16_t h) {
  return kind == HalfKind::kBF16 ? Bf16ToFloat(h) : F16ToFloat(h);
}

void ScalarPanel(HalfKind kind, const PanelProduct& p, int64_t panel) {
  const uint16_t* w = reinterpret_cast<const uint16_t*>(p.w + panel * p.panel_bytes);
  for (int64_t m = 0; m < p.m; ++m) {
    const float* x = p.x_f32 + m * p.x_stride;
    for (int64_t c = 0; c < kPanelColumns; ++c) {
      const int64_t n = panel * kPanelColumns + c;
      if (n >= p.n) break;
      float even = 0.0f, odd = 0.0f;
      for (int64_t g = 0; g < p.groups; ++g) {
        const uint16_t* wg = w + g * (kPanelGroupBytes / 2) + c * 2;
        even += WeightToFloat(kind, wg[0]) * x[2 * g];
        odd += WeightToFloat(kind, wg[1]) * x[2 * g + 1];
      }
      float r = even + odd;
      if (p.bias != nullptr) r += p.bias[n];
      p.y[m * p.y_stride + n - p.y_first] = r;
    }
  }
}

#if defined(__x86_64__)
#define SCD_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#define SCD_AVX2_TARGET __attribute__((target("avx2,fma,f16c")))

// The accumulators stay in registers through the k loop and are stored once for the epilogue
// (as model/int8_panels.cc's tile, for the same reason).
template <int MR, int NP>
SCD_BF16_TARGET void Bf16Tile(const PanelProduct& p, int64_t m0, int64_t panel) {
  __m512 acc[MR][NP];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NP; ++j) acc[i][j] = _mm512_setzero_ps();
  }
  const uint8_t* w = p.w + panel * p.panel_bytes;
  const uint16_t* x = p.x_bf16 + m0 * p.x_stride;
  for (int64_t g = 0; g < p.groups; ++g) {
    __m512bh wv[NP];
#pragma GCC unroll 8
    for (int j = 0; j < NP; ++j) {
      wv[j] = (__m512bh)_mm512_loadu_si512(w + j * p.panel_bytes + g * kPanelGroupBytes);
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      int32_t xi;
      std::memcpy(&xi, x + i * p.x_stride + 2 * g, 4);
      const __m512bh xb = (__m512bh)_mm512_set1_epi32(xi);
#pragma GCC unroll 8
      for (int j = 0; j < NP; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xb, wv[j]);
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
    const __m512 bias =
        p.bias != nullptr ? _mm512_maskz_loadu_ps(mask, p.bias + n0) : _mm512_setzero_ps();
    for (int i = 0; i < MR; ++i) {
      _mm512_mask_storeu_ps(p.y + (m0 + i) * p.y_stride + n0 - p.y_first, mask,
                            _mm512_add_ps(_mm512_load_ps(sums[i][j]), bias));
    }
  }
}

template <int MR>
constexpr PanelTile kBf16ByPanels[kBf16Panels] = {Bf16Tile<MR, 1>, Bf16Tile<MR, 2>, Bf16Tile<MR, 3>,
                                                  Bf16Tile<MR, 4>};
constexpr const PanelTile* kBf16Tiles[kBf16Rows] = {kBf16ByPanels<1>, kBf16ByPanels<2>,
                                                    kBf16ByPanels<3>, kBf16ByPanels<4>,
                                                    kBf16ByPanels<5>, kBf16ByPanels<6>};

// Eight halfwords (four columns x two k) widened to float32.
template <HalfKind kKind>
SCD_AVX2_TARGET inline __m256 Widen(const uint8_t* src) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
  if constexpr (kKind == HalfKind::kBF16) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    return _mm256_cvtph_ps(h);
  }
}

template <HalfKind kKind, int MR>
SCD_AVX2_TARGET void Avx2Tile(const PanelProduct& p, int64_t m0, int64_t panel) {
  __m256 acc[MR][4];
  for (int i = 0; i < MR; ++i) {
    for (int q = 0; q < 4; ++q) acc[i][q] = _mm256_setzero_ps();
  }
  const uint8_t* w = p.w + panel * p.panel_bytes;
  const float* x = p.x_f32 + m0 * p.x_stride;
  for (int64_t g = 0; g < p.groups; ++g) {
    __m256 wv[4];  // lanes: c0 k0, c0 k1, c1 k0, ... c3 k1
    for (int q = 0; q < 4; ++q) wv[q] = Widen<kKind>(w + g * kPanelGroupBytes + 16 * q);
    for (int i = 0; i < MR; ++i) {
      double pair;
      std::memcpy(&pair, x + i * p.x_stride + 2 * g, 8);
      const __m256 xb = _mm256_castpd_ps(_mm256_set1_pd(pair));  // x0 x1 x0 x1 ...
      for (int q = 0; q < 4; ++q) acc[i][q] = _mm256_fmadd_ps(wv[q], xb, acc[i][q]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int h = 0; h < 2; ++h) {
      const int64_t n0 = panel * kPanelColumns + 8 * h;
      if (n0 >= p.n) break;
      // Pairs of lanes summed: columns c0..c7 in order.
      const __m256 sums = _mm256_castpd_ps(_mm256_permute4x64_pd(
          _mm256_castps_pd(_mm256_hadd_ps(acc[i][2 * h], acc[i][2 * h + 1])), 0xD8));
      alignas(32) float r[8];
      _mm256_store_ps(r, sums);
      float* y = p.y + (m0 + i) * p.y_stride;
      for (int64_t c = 0; c < 8 && n0 + c < p.n; ++c) {
        y[n0 + c - p.y_first] = p.bias != nullptr ? r[c] + p.bias[n0 + c] : r[c];
      }
    }
  }
}

template <HalfKind kKind>
SCD_AVX2_TARGET void Avx2Panels(const PanelProduct& p, int64_t p0, int64_t p1) {
  for (int64_t panel = p0; panel < p1; ++panel) {
    int64_t m0 = 0;
    for (; m0 + kAvx2Rows <= p.m; m0 += kAvx2Rows) Avx2Tile<kKind, kAvx2Rows>(p, m0, panel);
    if (m0 < p.m) Avx2Tile<kKind, 1>(p, m0, panel);
  }
}
#endif  // __x86_64__

}  // namespace

uint16_t FloatToBf16(float v) { return c10::BFloat16(v).x; }
float Bf16ToFloat(uint16_t h) {
  return static_cast<float>(c10::BFloat16(h, c10::BFloat16::from_bits()));
}
uint16_t FloatToF16(float v) { return c10::Half(v).x; }
float F16ToFloat(uint16_t h) { return static_cast<float>(c10::Half(h, c10::Half::from_bits())); }

HalfKernel ChooseHalfKernel(HalfKind kind) {
  const KernelIsa& isa = RunnableKernelIsa();
  if (kind == HalfKind::kBF16 && isa.avx512_bf16) return HalfKernel::kAvx512Bf16;
  return isa.avx2 ? HalfKernel::kAvx2 : HalfKernel::kScalar;
}

void PrepareHalfRows(HalfKind kind, HalfKernel kernel, const float* x, int64_t m, int64_t k,
                     int64_t in_stride, int64_t out_stride, uint16_t* bf16, float* f32) {
  for (int64_t r = 0; r < m; ++r) {
    const float* row = x + r * in_stride;
    if (kernel == HalfKernel::kAvx512Bf16) {
      uint16_t* out = bf16 + r * out_stride;
      for (int64_t i = 0; i < k; ++i) out[i] = FloatToBf16(row[i]);
      std::fill(out + k, out + out_stride, uint16_t{0});
      continue;
    }
    float* out = f32 + r * out_stride;
    if (kind == HalfKind::kBF16) {
      for (int64_t i = 0; i < k; ++i) out[i] = Bf16ToFloat(FloatToBf16(row[i]));
    } else {
      std::copy(row, row + k, out);
    }
    std::fill(out + k, out + out_stride, 0.0f);
  }
}

int64_t HalfPanelsPerItem(HalfKernel kernel) {
  return kernel == HalfKernel::kAvx512Bf16 ? kBf16Panels : 1;
}

void HalfPanels(HalfKind kind, HalfKernel kernel, const PanelProduct& p, int64_t p0, int64_t p1) {
#if defined(__x86_64__)
  if (kernel == HalfKernel::kAvx512Bf16) {
    ForEachTile(p, p0, p1, kBf16Tiles, kBf16Rows, kBf16Panels);
    return;
  }
  if (kernel == HalfKernel::kAvx2) {
    if (kind == HalfKind::kBF16) {
      Avx2Panels<HalfKind::kBF16>(p, p0, p1);
    } else {
      Avx2Panels<HalfKind::kF16>(p, p0, p1);
    }
    return;
  }
#endif
  for (int64_t panel = p0; panel < p1; ++panel) ScalarPanel(kind, p, panel);
}

}  // namespace scd
