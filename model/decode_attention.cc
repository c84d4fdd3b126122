#include "model/decode_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "model/cpu_simd.h"

namespace scd {
namespace {

#if defined(__x86_64__)
// Dot products of q [hd] with keys k[0..n) (rows `stride` apart) into scores, eight keys at a
// time so eight accumulation chains run side by side.
__attribute__((target("avx2,fma"))) void Scores(const float* q, const float* k, int64_t L,
                                                int64_t hd, int64_t stride, float* scores) {
  int64_t l = 0;
  for (; l + 8 <= L; l += 8) {
    __m256 acc[8];
    for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t c = 0; c < hd; c += 8) {
      const __m256 qv = _mm256_loadu_ps(q + c);
      for (int i = 0; i < 8; ++i) {
        acc[i] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + (l + i) * stride + c), acc[i]);
      }
    }
    for (int i = 0; i < 8; ++i) scores[l + i] = Sum8(acc[i]);
  }
  for (; l < L; ++l) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t c = 0; c < hd; c += 8) {
      acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), _mm256_loadu_ps(k + l * stride + c), acc);
    }
    scores[l] = Sum8(acc);
  }
}

// out [hd] = sum_l p[l] v[l] / total, 64 values of a row at a time (eight chains side by side).
__attribute__((target("avx2,fma"))) void Weighted(const float* p, const float* v, int64_t L,
                                                  int64_t hd, int64_t stride, float scale,
                                                  float* out) {
  for (int64_t c0 = 0; c0 < hd; c0 += 64) {
    const int chunks = static_cast<int>(std::min<int64_t>(64, hd - c0) / 8);
    __m256 acc[8];
    for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t l = 0; l < L; ++l) {
      const __m256 pl = _mm256_set1_ps(p[l]);
      const float* row = v + l * stride + c0;
      for (int i = 0; i < chunks; ++i) {
        acc[i] = _mm256_fmadd_ps(pl, _mm256_loadu_ps(row + 8 * i), acc[i]);
      }
    }
    const __m256 s = _mm256_set1_ps(scale);
    for (int i = 0; i < chunks; ++i) _mm256_storeu_ps(out + c0 + 8 * i, _mm256_mul_ps(acc[i], s));
  }
}

// exp(x) for eight lanes, x <= 0 (scores less their maximum): Cephes' expf -- x = n ln 2 + r
// with |r| <= ln(2) / 2, a degree-7 polynomial for e^r, times 2^n -- within 2 ulps of std::exp;
// below -87.3 (e^x under float32's normal range) it gives 0.
__attribute__((target("avx2,fma"))) inline __m256 Exp8(__m256 x) {
  const __m256 low = _mm256_set1_ps(-87.3f);
  const __m256 underflow = _mm256_cmp_ps(x, low, _CMP_LT_OQ);
  x = _mm256_max_ps(x, low);
  const __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f),
                                                   _mm256_set1_ps(0.5f)));
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}

// One query row q [hd] against L keys and values (rows `stride` floats apart) into out [hd].
// The maximum, the exponentials and their total run eight scores at a time (the tail with the
// same polynomial, in a padded lane), in a fixed order.
__attribute__((target("avx2,fma"))) void AttendRow(const float* q, const float* k,
                                                   const float* v, int64_t L, int64_t hd,
                                                   int64_t stride, float* scores, float* out) {
  Scores(q, k, L, hd, stride, scores);
  const int64_t L8 = L & ~int64_t{7};
  __m256 top8 = _mm256_set1_ps(-INFINITY);
  for (int64_t l = 0; l < L8; l += 8) top8 = _mm256_max_ps(top8, _mm256_loadu_ps(scores + l));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, top8);
  float top = -INFINITY;
  for (float t : lanes) top = std::max(top, t);
  for (int64_t l = L8; l < L; ++l) top = std::max(top, scores[l]);
  const __m256 shift = _mm256_set1_ps(top);
  __m256 total8 = _mm256_setzero_ps();
  for (int64_t l = 0; l < L8; l += 8) {
    const __m256 p = Exp8(_mm256_sub_ps(_mm256_loadu_ps(scores + l), shift));
    _mm256_storeu_ps(scores + l, p);
    total8 = _mm256_add_ps(total8, p);
  }
  float total = Sum8(total8);
  if (L8 < L) {
    for (int i = 0; i < 8; ++i) lanes[i] = L8 + i < L ? scores[L8 + i] - top : -INFINITY;
    _mm256_store_ps(lanes, Exp8(_mm256_load_ps(lanes)));
    for (int64_t l = L8; l < L; ++l) {
      scores[l] = lanes[l - L8];
      total += scores[l];
    }
  }
  Weighted(scores, v, L, hd, stride, 1.0f / total, out);
}
#endif

}  // namespace

bool DecodeAttentionAvailable(int64_t head_dim) {
  return CpuHasAvx2Fma() && head_dim > 0 && head_dim % 8 == 0;
}

void DecodeAttention(const DecodeAttentionArgs& a) {
#if defined(__x86_64__)
  thread_local std::vector<float> scores;
  scores.resize(static_cast<size_t>(a.length));
  for (int64_t h = 0; h < a.kv_heads; ++h) {
    for (int64_t j = 0; j < a.group; ++j) {
      const int64_t row = (h * a.group + j) * a.head_dim;
      AttendRow(a.q + row, a.keys + h * a.head_stride, a.values + h * a.head_stride, a.length,
                a.head_dim, a.head_dim, scores.data(), a.out + row);
    }
  }
#else
  (void)a;
#endif
}

}  // namespace scd
