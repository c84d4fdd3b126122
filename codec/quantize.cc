#include "codec/quantize.h"

#include <ATen/ATen.h>

namespace scd {
namespace {

// Rounds a float32 tensor of non-negative scales to f16 without ever rounding down, so that a
// stored scale always covers the range it was computed for.
at::Tensor HalfScaleNotBelow(const at::Tensor& scale) {
  // f16 keeps 11 significant bits: a 2^-10 relative nudge survives round-to-nearest.
  return (scale * (1.0 + 1.0 / 1024)).to(at::kHalf);
}

}  // namespace

QuantizedInt8 QuantizeInt8Rows(const at::Tensor& x) {
  at::Tensor xf = x.to(at::kCPU, at::kFloat).contiguous();
  const int64_t width = xf.dim() == 0 ? 1 : xf.size(-1);
  at::Tensor rows = xf.reshape({-1, width});
  QuantizedInt8 q;
  q.scales = HalfScaleNotBelow(rows.abs().amax(1) / 127.0);  // [rows]
  at::Tensor scale = q.scales.to(at::kFloat).unsqueeze(1);
  at::Tensor safe = at::where(scale > 0, scale, at::ones_like(scale));
  q.values = (rows / safe).round().clamp(-127, 127).to(at::kChar).reshape(xf.sizes());
  return q;
}

at::Tensor DequantizeInt8Rows(const at::Tensor& values, const at::Tensor& scales) {
  const int64_t width = values.dim() == 0 ? 1 : values.size(-1);
  at::Tensor rows = values.to(at::kFloat).reshape({-1, width});
  return (rows * scales.to(at::kFloat).unsqueeze(1)).reshape(values.sizes());
}

QuantizedInt4 QuantizeInt4Groups(const at::Tensor& x) {
  at::Tensor flat = x.to(at::kCPU, at::kFloat).contiguous().reshape({-1});
  QuantizedInt4 q;
  q.numel = flat.numel();
  const int64_t groups = (q.numel + kInt4GroupSize - 1) / kInt4GroupSize;
  const int64_t padded = groups * kInt4GroupSize;
  if (padded > q.numel) {
    // Pad with the last value: it changes neither the group's minimum nor its maximum.
    flat = at::cat({flat, flat.narrow(0, q.numel - 1, 1).expand({padded - q.numel})});
  }
  at::Tensor g = flat.view({groups, kInt4GroupSize});
  at::Tensor lo = std::get<0>(g.min(1)), hi = std::get<0>(g.max(1));
  at::Tensor zero = lo.to(at::kHalf);
  at::Tensor scale = HalfScaleNotBelow((hi - zero.to(at::kFloat)).clamp_min(0) / 15.0);
  q.scale_zero = at::stack({scale, zero}, 1);  // [groups, 2] f16
  at::Tensor s = scale.to(at::kFloat).unsqueeze(1), z = zero.to(at::kFloat).unsqueeze(1);
  at::Tensor safe = at::where(s > 0, s, at::ones_like(s));
  at::Tensor codes = ((g - z) / safe).round().clamp(0, 15).to(at::kByte).reshape({-1});
  // Two codes per byte, even index in the low nibble.
  q.packed = codes.slice(0, 0, padded, 2)
                 .bitwise_or(codes.slice(0, 1, padded, 2).mul(16))
                 .narrow(0, 0, (q.numel + 1) / 2)  // the padding does not travel
                 .contiguous();
  return q;
}

at::Tensor DequantizeInt4Groups(const at::Tensor& packed, const at::Tensor& scale_zero,
                                int64_t numel) {
  const int64_t groups = scale_zero.size(0);
  at::Tensor bytes = packed.to(at::kCPU, at::kByte);
  bytes = at::constant_pad_nd(bytes, {0, groups * kInt4GroupSize / 2 - bytes.numel()});
  at::Tensor low = bytes.bitwise_and(15), high = bytes.div(16, "floor");
  at::Tensor codes = at::stack({low, high}, 1).reshape({-1}).to(at::kFloat);  // padded length
  at::Tensor g = codes.view({groups, kInt4GroupSize});
  at::Tensor sz = scale_zero.to(at::kFloat);
  return (g * sz.select(1, 0).unsqueeze(1) + sz.select(1, 1).unsqueeze(1))
      .reshape({-1})
      .narrow(0, 0, numel);
}

}  // namespace scd
