// What this machine can do, for benches that compare against it rather than against themselves:
// the CPU's FP32 peak estimate and the GEMM speed of every OpenBLAS kernel it can run, each
// measured in a child process (OpenBLAS reads OPENBLAS_CORETYPE once, when it is loaded).
// Thread-safety: call from main() (children are started with popen).
#ifndef SCD_BENCH_MACHINE_LIMITS_H_
#define SCD_BENCH_MACHINE_LIMITS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace scd {

struct PeakEstimate {
  int cores = 0;           // physical cores this process may run on
  int lanes = 0;           // float32 lanes of the widest vector the CPU runs
  int flops_per_lane = 0;  // per cycle and unit: 2 for a fused multiply-add (or a mul + an add)
  int units = 0;           // vector FMA units per core (assumed: 2, as on Haswell+ and Zen)
  double ghz = 0;          // measured: a chain of dependent integer adds (1 cycle each)
  std::string isa;         // "AVX2+FMA", ...
  double gflops() const { return cores * lanes * flops_per_lane * units * ghz; }
  std::string Describe() const;  // "2 cores x 8 lanes x 2 (FMA) x 2 units x 3.20 GHz = 204.8 GF/s"
};
PeakEstimate EstimateFp32Peak();

// A GEMM [m, k] x [k, n] as the model runs its dominant one: at::mm(x, w.t()), w [n, k].
struct GemmShape {
  int64_t m = 0, k = 0, n = 0;
  double flops() const { return 2.0 * m * k * n; }
  std::string Key() const;  // "512x2048x11264"
};

// GF/s of each shape (best of `reps`) with OpenBLAS core `core` and `threads` BLAS threads, in a
// child process running this program with --gemm-probe. Empty on failure (logged to stderr).
std::map<std::string, double> ProbeGemm(const std::string& core, int threads,
                                        const std::vector<GemmShape>& shapes, int reps);

// The child's side: `spec` is "MxKxN,MxKxN,..."; prints one "gemm <key> <GF/s>" line per shape.
int RunGemmProbe(const std::string& spec, int reps);

}  // namespace scd

#endif  // SCD_BENCH_MACHINE_LIMITS_H_
