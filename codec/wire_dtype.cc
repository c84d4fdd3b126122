#include "codec/wire_dtype.h"

#include "absl/strings/str_cat.h"

namespace scd {

std::string WireDtypeName(WireDtype dtype) {
  switch (dtype) {
    case WireDtype::kF32:
      return "f32";
    case WireDtype::kF16:
      return "f16";
    case WireDtype::kBF16:
      return "bf16";
    case WireDtype::kInt8:
      return "int8";
    case WireDtype::kInt4:
      return "int4";
  }
  return "?";
}

absl::StatusOr<WireDtype> ParseWireDtype(const std::string& name) {
  for (WireDtype d :
       {WireDtype::kF32, WireDtype::kF16, WireDtype::kBF16, WireDtype::kInt8, WireDtype::kInt4}) {
    if (WireDtypeName(d) == name) return d;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("wire dtype '", name, "' is not one of f32, f16, bf16, int8, int4"));
}

}  // namespace scd
