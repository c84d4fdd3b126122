// WireDtype: how code and cache values travel, torch-free (the coordinator reads frontiers).
// Thread-safety: plain values and pure functions.
#ifndef SCD_CODEC_WIRE_DTYPE_H_
#define SCD_CODEC_WIRE_DTYPE_H_

#include <string>

#include "absl/status/statusor.h"

namespace scd {

// kInt8: symmetric per-row scale (f16); kInt4: asymmetric groups of 32 consecutive values with
// f16 scale and zero, two values per byte.
enum class WireDtype { kF32, kF16, kBF16, kInt8, kInt4 };

std::string WireDtypeName(WireDtype dtype);
absl::StatusOr<WireDtype> ParseWireDtype(const std::string& name);

}  // namespace scd

#endif  // SCD_CODEC_WIRE_DTYPE_H_
