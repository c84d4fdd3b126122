// What the hand-written CPU kernels (model/skinny_gemm.h, model/decode_attention.h,
// model/packed_weight.h) may use on this CPU, and what they share: an 8-lane horizontal sum in a
// fixed order.
//
// The kernels are compiled for their ISA through function attributes (the rest of the build stays
// at the baseline ISA) and called only where the CPU and its OS run that ISA. SCD_KERNEL_ISA caps
// the level, to run the portable paths on a CPU that has more (tests, scripts/numeric_kernels.sh):
//   scalar   no SIMD kernel of ours (the f32 paths use BLAS and ATen instead)
//   avx2     AVX2 + FMA + F16C at most
//   avx512   everything the CPU has (the default): AVX-512 VNNI for 8-bit weights, AVX-512 BF16
//            for bf16 weights where present
// Thread-safety: stateless (the CPU check is computed once).
#ifndef SCD_MODEL_CPU_SIMD_H_
#define SCD_MODEL_CPU_SIMD_H_

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <string>

namespace scd {

struct KernelIsa {
  bool avx2 = false;        // AVX2, FMA and F16C
  bool avx512 = false;      // AVX-512 F, BW, VL, DQ with ZMM state saved by the OS
  bool avx512_vnni = false;  // and VNNI (vpdpbusd: 8-bit dot products)
  bool avx512_bf16 = false;  // and BF16 (vdpbf16ps: bf16 pair dot products)
};

// The CPU's kernels, capped by SCD_KERNEL_ISA (read once).
const KernelIsa& RunnableKernelIsa();
// What the CPU has, uncapped.
KernelIsa DetectKernelIsa();
// Applies a cap ("scalar", "avx2", "avx512"; anything else: no cap) to `isa`.
KernelIsa CapKernelIsa(KernelIsa isa, const std::string& cap);
// "avx512-vnni+bf16", "avx512-vnni", "avx512", "avx2", "scalar".
std::string KernelIsaName(const KernelIsa& isa);

inline bool CpuHasAvx2Fma() { return RunnableKernelIsa().avx2; }

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
