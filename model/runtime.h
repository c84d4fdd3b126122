// Process-wide runtime settings for libtorch: intra-op threads, device and dtype selection.
// Thread-safety: call ConfigureThreads once at start-up, before any model work.
#ifndef SCD_MODEL_RUNTIME_H_
#define SCD_MODEL_RUNTIME_H_

#include <string>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "absl/status/statusor.h"

namespace scd {

// Sets libtorch's intra-op thread count. `threads <= 0` means all cores. Debian's libtorch starts
// with one thread, so every binary calls this. Returns the count in effect.
int ConfigureThreads(int threads);

// "cpu", "cuda" or "cuda:N". CUDA requires a CUDA-enabled libtorch (-DTorch_DIR=...) and a GPU.
absl::StatusOr<c10::Device> ParseDevice(const std::string& name);

// "f32"/"float32", "bf16"/"bfloat16", "f16"/"float16". Half precision needs a CUDA device;
// bf16 also runs on CPU (slowly, for tests).
absl::StatusOr<c10::ScalarType> ParseDtype(const std::string& name, const c10::Device& device);

std::string DtypeName(c10::ScalarType dtype);

}  // namespace scd

#endif  // SCD_MODEL_RUNTIME_H_
