#include "model/runtime.h"

#include <thread>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "absl/strings/str_cat.h"

namespace scd {

int ConfigureThreads(int threads) {
  if (threads <= 0) {
    threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }
  at::set_num_threads(threads);
  return at::get_num_threads();
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

absl::StatusOr<c10::ScalarType> ParseDtype(const std::string& name, const c10::Device& device) {
  if (name == "f32" || name == "float32" || name == "fp32") return c10::kFloat;
  if (name == "bf16" || name == "bfloat16") return c10::kBFloat16;
  if (name == "f16" || name == "float16" || name == "fp16") {
    if (!device.is_cuda()) {
      return absl::InvalidArgumentError(
          "dtype 'f16' needs a CUDA device (CPU half-precision matmuls are unsupported); use bf16");
    }
    return c10::kHalf;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("dtype '", name, "' is not supported (expected f32, bf16 or f16)"));
}

std::string DtypeName(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::kFloat: return "f32";
    case c10::kBFloat16: return "bf16";
    case c10::kHalf: return "f16";
    default: return c10::toString(dtype);
  }
}

}  // namespace scd
