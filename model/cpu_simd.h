// What the hand-written CPU kernels (model/skinny_gemm.h, model/decode_attention.h) share:
// whether this CPU runs AVX2 + FMA (they are compiled for it through function attributes, the
// rest of the build staying at the baseline ISA), and an 8-lane horizontal sum in a fixed order.
// Thread-safety: stateless (the CPU check is computed once).
#ifndef SCD_MODEL_CPU_SIMD_H_
#define SCD_MODEL_CPU_SIMD_H_

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace scd {

inline bool CpuHasAvx2Fma() {
#if defined(__x86_64__)
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
#else
  return false;
#endif
}

#if defined(__x86_64__)
// ((v0+v4) + (v2+v6)) + ((v1+v5) + (v3+v7)): the same order for every call.
__attribute__((target("avx2,fma"))) inline float Sum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

}  // namespace scd

#endif  // SCD_MODEL_CPU_SIMD_H_
