// Process-wide runtime settings for libtorch: intra-op threads, device and dtype selection.
// Thread-safety: call ConfigureThreads once at start-up, before any model work.
#ifndef SCD_MODEL_RUNTIME_H_
#define SCD_MODEL_RUNTIME_H_

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <string>

#include "absl/status/statusor.h"
#include "model/packed_weight.h"

namespace scd {

struct ThreadSettings {
  int blas_threads = 0;  // threads of the BLAS library's own pool (GEMMs), 0 if it has none
  int aten_threads = 0;  // libtorch's intra-op (OpenMP) pool: elementwise ops, softmax, copies
  std::string blas;      // e.g. "openblas-pthreads", "openblas-openmp", "other"
  std::string kernel;    // the BLAS kernel in use and why (model/blas_kernel.h)
  std::string ToString() const;
};

// Gives the process `threads` compute threads (<= 0: all cores). Every binary calls this once.
//
// Debian's libtorch runs GEMMs in OpenBLAS, which (libopenblas0-pthread) keeps a pthread pool of
// its own beside libtorch's OpenMP pool. Both pools busy-wait after each parallel region, so
// with N threads in each on N cores every GEMM fights the other pool's spinning threads and
// prefill loses about half its speed (bench/README.md). So: the BLAS pool gets `threads`, and
// when it is separate from OpenMP libtorch's pool gets 1 thread; with a BLAS that shares the
// OpenMP pool (MKL, OpenBLAS-OpenMP) or none, libtorch's pool gets `threads`.
// `aten_threads > 0` overrides libtorch's share (for experiments such as bench/README.md's).
ThreadSettings ConfigureThreads(int threads, int aten_threads = 0);

// "cpu", "cuda" or "cuda:N". CUDA requires a CUDA-enabled libtorch (-DTorch_DIR=...) and a GPU.
absl::StatusOr<c10::Device> ParseDevice(const std::string& name);

// A node's precision (its --dtype): the dtype of activations and KV cache, and how the weights are
// held. On a CUDA device bf16 and f16 are the model's dtype throughout (libtorch's kernels); on a
// CPU the weights are packed at that precision for the runtime's own kernels while activations
// and the KV cache stay float32 (model/packed_weight.h), as llama.cpp runs its 16- and 8-bit
// weights. int8 (8-bit weights, one scale per row) runs on CPUs only.
struct Precision {
  c10::ScalarType dtype = c10::kFloat;
  WeightFormat weights = WeightFormat::kDense;
};

// "f32"/"float32"/"fp32", "bf16"/"bfloat16", "f16"/"float16"/"fp16", "int8"/"i8".
absl::StatusOr<Precision> ParsePrecision(const std::string& name, const c10::Device& device);
// The name ParsePrecision takes for it: "f32", "bf16", "f16", "int8".
std::string PrecisionName(const Precision& precision);

std::string DtypeName(c10::ScalarType dtype);

}  // namespace scd

#endif  // SCD_MODEL_RUNTIME_H_
