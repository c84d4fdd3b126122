// RotaryEmbedding: rotate-half RoPE (the HF convention) with one model's own rope config: theta
// plus none/linear/llama3 frequency scaling. The codec uses it to rotate transferred pre-RoPE keys
// with the *consumer's* rules, so it is independent of any model instance.
// Thread-safety: immutable; safe from many threads.
#ifndef SCD_MODEL_ROPE_H_
#define SCD_MODEL_ROPE_H_

#include <ATen/core/Tensor.h>

#include <utility>
#include <vector>

#include "model/config.h"

namespace scd {

class RotaryEmbedding {
 public:
  RotaryEmbedding(const RopeConfig& rope, int64_t head_dim);

  // cos and sin of position x frequency, computed in float64 then cast to `like`'s dtype/device.
  // positions: [T] int64. Returns two tensors [T, head_dim / 2].
  std::pair<at::Tensor, at::Tensor> Tables(const at::Tensor& positions,
                                           const at::Tensor& like) const;

  // Rotates `x` (last dim head_dim) with tables already shaped to broadcast against x's first
  // head_dim/2 and last head_dim/2 halves. Returns a new contiguous tensor shaped like x.
  static at::Tensor Rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

  // x: [heads, T, head_dim] at positions [T] -> rotated copy.
  at::Tensor Apply(const at::Tensor& x, const at::Tensor& positions) const;
  // Inverse rotation (rotating by -angle); exact up to float rounding.
  at::Tensor Invert(const at::Tensor& x, const at::Tensor& positions) const;

  int64_t head_dim() const { return head_dim_; }
  const std::vector<double>& inv_freq() const { return inv_freq_; }

 private:
  int64_t head_dim_;
  std::vector<double> inv_freq_;  // [head_dim / 2], scaling already applied
};

}  // namespace scd

#endif  // SCD_MODEL_ROPE_H_
