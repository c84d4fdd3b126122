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

// One query row q [hd] against L keys and values (rows `stride` floats apart) into out [hd].
__attribute__((target("avx2,fma"))) void AttendRow(const float* q, const float* k,
                                                   const float* v, int64_t L, int64_t hd,
                                                   int64_t stride, float* scores, float* out) {
  Scores(q, k, L, hd, stride, scores);
  float top = -INFINITY;
  for (int64_t l = 0; l < L; ++l) top = std::max(top, scores[l]);
  float total = 0;
  for (int64_t l = 0; l < L; ++l) {
    scores[l] = std::exp(scores[l] - top);
    total += scores[l];
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
