#include "model/cpu_simd.h"

#include <cstdint>
#include <cstdlib>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace scd {
namespace {

#if defined(__x86_64__)
uint64_t Xcr0() {
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}
#endif

}  // namespace

KernelIsa DetectKernelIsa() {
  KernelIsa isa;
#if defined(__x86_64__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(0, &eax, &ebx, &ecx, &edx) == 0 || eax < 7) return isa;
  __get_cpuid(1, &eax, &ebx, &ecx, &edx);
  const bool osxsave = ecx & (1u << 27), fma = ecx & (1u << 12), f16c = ecx & (1u << 29);
  const bool avx = ecx & (1u << 28);
  const uint64_t xcr0 = osxsave ? Xcr0() : 0;
  const bool ymm_state = (xcr0 & 0x6) == 0x6, zmm_state = (xcr0 & 0xe6) == 0xe6;
  __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx);
  isa.avx2 = avx && ymm_state && fma && f16c && (ebx & (1u << 5));
  // F (16), DQ (17), BW (30), VL (31).
  const unsigned avx512_bits = (1u << 16) | (1u << 17) | (1u << 30) | (1u << 31);
  isa.avx512 = isa.avx2 && zmm_state && (ebx & avx512_bits) == avx512_bits;
  isa.avx512_vnni = isa.avx512 && (ecx & (1u << 11));
  unsigned eax1 = 0, ebx1 = 0, ecx1 = 0, edx1 = 0;
  __get_cpuid_count(7, 1, &eax1, &ebx1, &ecx1, &edx1);
  isa.avx512_bf16 = isa.avx512 && (eax1 & (1u << 5));
#endif
  return isa;
}

KernelIsa CapKernelIsa(KernelIsa isa, const std::string& cap) {
  if (cap == "scalar") return KernelIsa{};
  if (cap == "avx2") {
    const bool avx2 = isa.avx2;
    isa = KernelIsa{};
    isa.avx2 = avx2;
  }
  return isa;
}

const KernelIsa& RunnableKernelIsa() {
  static const KernelIsa isa = [] {
    const char* cap = std::getenv("SCD_KERNEL_ISA");
    return CapKernelIsa(DetectKernelIsa(), cap == nullptr ? "" : cap);
  }();
  return isa;
}

std::string KernelIsaName(const KernelIsa& isa) {
  if (isa.avx512) {
    std::string name = "avx512";
    if (isa.avx512_vnni) name += "-vnni";
    if (isa.avx512_bf16) name += isa.avx512_vnni ? "+bf16" : "-bf16";
    return name;
  }
  return isa.avx2 ? "avx2" : "scalar";
}

}  // namespace scd
