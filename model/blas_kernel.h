// BLAS kernel selection: the right GEMM kernels for this CPU without being told.
//
// Debian's OpenBLAS is built DYNAMIC_ARCH: when it is loaded it reads the CPU's family and model
// and picks a kernel set ("core"). A CPU model newer than the library (OpenBLAS 0.3.21 on an
// Intel Xeon of family 6 model 207, say) is not in its table, and it falls back to the generic
// SSE3 "Prescott" kernels: 4-5x slower GEMMs on a CPU with AVX-512 (bench/README.md). OpenBLAS
// reads OPENBLAS_CORETYPE once, when it is loaded, so the remedy is to set it and run the program
// again: SelectBlasKernel does that, first thing in every main that links libtorch, and logs one
// line naming the kernel OpenBLAS picked and the one now in use.
//
// The rule (DecideBlasKernel, a pure function): switch only when OpenBLAS runs a generic kernel
// (SSE or AVX level: Prescott, Core2, Nehalem, Sandybridge, Barcelona, Bulldozer family, ...)
// while the CPU and its OS can run AVX2+FMA ("Haswell") or AVX-512 F/BW/VL/DQ ("SkylakeX"). A core
// OpenBLAS chose for the CPU's own model (Haswell, Zen, SkylakeX, ...) is kept; a user's own
// OPENBLAS_CORETYPE always wins; another BLAS (MKL, a CUDA build without OpenBLAS) is left alone.
//
// Test-only switch: SCD_BLAS_SIMULATE_FALLBACK=1 makes a process first re-run itself on the
// generic Prescott kernels and then treat that as OpenBLAS's fallback, so the whole path (start
// slow, re-exec, run fast) is exercised on a CPU whose OpenBLAS picks right.
//
// Thread-safety: SelectBlasKernel must be called from main() before any thread of the program's
// own exists (it may replace the process). The rest are pure or read-only.
#ifndef SCD_MODEL_BLAS_KERNEL_H_
#define SCD_MODEL_BLAS_KERNEL_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace scd {

// Vector ISA levels, each needing the ones before it; an OpenBLAS core needs one of them.
enum class IsaLevel { kSse3 = 0, kAvx = 1, kAvx2 = 2, kAvx512 = 3 };
const char* IsaLevelName(IsaLevel level);  // "SSE3", "AVX", "AVX2+FMA", "AVX-512"

// What the CPU and the OS (XCR0: the register state it saves) let a program execute.
struct CpuFeatures {
  std::string vendor;  // "GenuineIntel", "AuthenticAMD", ...
  std::string brand;   // "Intel(R) Xeon(R) Platinum 8581C CPU @ 2.30GHz"
  int family = 0, model = 0;
  bool avx = false;
  bool avx2_fma = false;  // AVX2 and FMA3
  bool avx512 = false;    // AVX-512 F, BW, VL, DQ, CD with ZMM state enabled by the OS
  IsaLevel level() const;
};
CpuFeatures DetectCpuFeatures();

// The ISA level an OpenBLAS core's kernels need ("Haswell" -> kAvx2, "Prescott" -> kSse3);
// nullopt for a name this table does not know (case-insensitive, as OpenBLAS compares).
std::optional<IsaLevel> OpenBlasCoreLevel(absl::string_view core);
// OpenBLAS cores this CPU can execute, one per ISA level, best first: a subset of
// SkylakeX, Haswell, Sandybridge, Prescott.
std::vector<std::string> RunnableOpenBlasCores(const CpuFeatures& cpu);

struct BlasKernelInputs {
  std::string picked;  // openblas_get_corename(); empty when the BLAS is not OpenBLAS
  CpuFeatures cpu;
  bool user_chose = false;  // OPENBLAS_CORETYPE set by the user (not by this module)
};
struct BlasKernelDecision {
  bool switch_core = false;
  std::string core;    // the core to run with when switching
  std::string reason;  // one phrase, for the log line
};
// Pure: whether to run again with another OpenBLAS core.
BlasKernelDecision DecideBlasKernel(const BlasKernelInputs& inputs);

// The core OpenBLAS runs in this process (openblas_get_corename), or "" with another BLAS.
std::string OpenBlasCoreInUse();

// First thing in main(): may re-execute the program (same argv, /proc/self/exe) with
// OPENBLAS_CORETYPE set, per DecideBlasKernel; in the re-executed process logs one line (warn) to
// stderr naming the core OpenBLAS picked and the one in use. Never fails: when re-executing is
// impossible it logs why and goes on with the kernels it has.
void SelectBlasKernel(int argc, char** argv);

// One line for logs and benches: "openblas core Haswell (picked by OpenBLAS; CPU: AVX2+FMA)" or
// "openblas core SkylakeX (OpenBLAS picked Prescott, a generic kernel, on a CPU with AVX-512;
// re-executed with OPENBLAS_CORETYPE=SkylakeX)".
std::string BlasKernelReport();

}  // namespace scd

#endif  // SCD_MODEL_BLAS_KERNEL_H_
