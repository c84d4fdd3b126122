#include "model/runtime.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <dlfcn.h>

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "model/blas_kernel.h"
#include "model/compute_steps.h"
#include "model/skinny_gemm.h"

namespace scd {

namespace {

// OpenBLAS's thread controls, looked up at run time: libtorch may use another BLAS (MKL, or
// cuBLAS in a CUDA build), and then there is nothing to set.
struct OpenBlasControls {
  void (*set_num_threads)(int) = nullptr;
  int (*get_parallel)() = nullptr;  // 0 sequential, 1 pthreads, 2 OpenMP
};

OpenBlasControls FindOpenBlas() {
  OpenBlasControls c;
  c.set_num_threads =
      reinterpret_cast<void (*)(int)>(::dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  c.get_parallel = reinterpret_cast<int (*)()>(::dlsym(RTLD_DEFAULT, "openblas_get_parallel"));
  return c;
}

}  // namespace

std::string ThreadSettings::ToString() const {
  return absl::StrCat("blas=", blas, " blas_threads=", blas_threads, " aten_threads=", aten_threads,
                      kernel.empty() ? "" : "; ", kernel);
}

ThreadSettings ConfigureThreads(int threads, int aten_threads) {
  if (threads <= 0) {
    threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }
  ThreadSettings settings;
  const OpenBlasControls openblas = FindOpenBlas();
  const int parallel = openblas.get_parallel != nullptr ? openblas.get_parallel() : -1;
  if (openblas.set_num_threads != nullptr && parallel == 1) {
    openblas.set_num_threads(threads);
    at::set_num_threads(1);
    settings.blas = "openblas-pthreads";
    settings.blas_threads = threads;
    // Concurrent model steps (model/compute_steps.h): each on one BLAS thread while more than one
    // runs; a step alone gets the pool. The pool keeps its threads either way (lowering the count
    // only changes how many a call uses), so the switch is a store OpenBLAS reads as a call starts.
    SetBlasSharing(
        [set = openblas.set_num_threads, threads](bool shared) { set(shared ? 1 : threads); });
  } else {
    if (openblas.set_num_threads != nullptr) openblas.set_num_threads(threads);
    at::set_num_threads(threads);
    settings.blas = parallel == 2 ? "openblas-openmp" : parallel == 0 ? "openblas-serial" : "other";
  }
  if (parallel != 1) SetBlasSharing(nullptr);  // no separate pool to share
  if (aten_threads > 0) at::set_num_threads(aten_threads);
  SetSkinnyThreads(threads);  // the few-row projections of batched decode steps
  settings.aten_threads = at::get_num_threads();
  settings.kernel = BlasKernelReport();
  return settings;
}

absl::StatusOr<c10::Device> ParseDevice(const std::string& name) {
  if (name == "cpu") return c10::Device(c10::kCPU);
  if (name.rfind("cuda", 0) == 0) {
    if (!at::hasCUDA()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "device '", name,
          "': this build's libtorch has no CUDA support (rebuild with -DTorch_DIR pointing at a "
          "CUDA-enabled libtorch) or no GPU is visible"));
    }
    try {
      return c10::Device(name);
    } catch (const c10::Error&) {
      return absl::InvalidArgumentError(absl::StrCat("device '", name, "' is not a valid device"));
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("device '", name, "' is not supported (expected cpu, cuda or cuda:N)"));
}

absl::StatusOr<Precision> ParsePrecision(const std::string& name, const c10::Device& device) {
  Precision p;
  if (name == "f32" || name == "float32" || name == "fp32") return p;
  const bool bf16 = name == "bf16" || name == "bfloat16";
  const bool f16 = name == "f16" || name == "float16" || name == "fp16";
  if (bf16 || f16) {
    if (device.is_cpu()) {
      p.weights = bf16 ? WeightFormat::kBF16 : WeightFormat::kF16;
    } else {
      p.dtype = bf16 ? c10::kBFloat16 : c10::kHalf;
    }
    return p;
  }
  if (name == "int8" || name == "i8") {
    if (!device.is_cpu()) {
      return absl::InvalidArgumentError(
          absl::StrCat("dtype 'int8' runs on the CPU only (device ", device.str(), ")"));
    }
    p.weights = WeightFormat::kInt8;
    return p;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("dtype '", name, "' is not supported (expected f32, bf16, f16 or int8)"));
}

std::string PrecisionName(const Precision& precision) {
  return precision.weights == WeightFormat::kDense ? DtypeName(precision.dtype)
                                                    : WeightFormatName(precision.weights);
}

std::string DtypeName(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::kFloat:
      return "f32";
    case c10::kBFloat16:
      return "bf16";
    case c10::kHalf:
      return "f16";
    default:
      return c10::toString(dtype);
  }
}

}  // namespace scd
