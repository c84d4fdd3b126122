// Quantizers for the wire: symmetric int8 with one scale per row (codes), and asymmetric int4 in
// groups of 32 consecutive values with an f16 scale and zero point (the int4 KV baseline).
// Thread-safety: stateless functions.
#ifndef SCD_CODEC_QUANTIZE_H_
#define SCD_CODEC_QUANTIZE_H_

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace scd {

inline constexpr int64_t kInt4GroupSize = 32;

struct QuantizedInt8 {
  at::Tensor values;  // int8, same shape as the input
  at::Tensor scales;  // f16 [rows]: max |x| / 127 per row (last dim is the row)
};
QuantizedInt8 QuantizeInt8Rows(const at::Tensor& x);
at::Tensor DequantizeInt8Rows(const at::Tensor& values, const at::Tensor& scales);

struct QuantizedInt4 {
  at::Tensor packed;      // uint8 [ceil(n / 2)]: value 2i in the low nibble, 2i+1 in the high one
  at::Tensor scale_zero;  // f16 [groups, 2]: x ~ q * scale + zero, q in [0, 15]
  int64_t numel = 0;
};
// Groups are 32 consecutive values of the flattened (row-major) tensor; the last may be short.
QuantizedInt4 QuantizeInt4Groups(const at::Tensor& x);
at::Tensor DequantizeInt4Groups(const at::Tensor& packed, const at::Tensor& scale_zero,
                                int64_t numel);

}  // namespace scd

#endif  // SCD_CODEC_QUANTIZE_H_
