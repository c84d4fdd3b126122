#include "model/rope.h"

#include <ATen/ATen.h>

#include <cmath>

namespace scd {

RotaryEmbedding::RotaryEmbedding(const RopeConfig& rope, int64_t head_dim) : head_dim_(head_dim) {
  const int64_t half = head_dim / 2;
  inv_freq_.resize(half);
  for (int64_t i = 0; i < half; ++i) {
    inv_freq_[i] = 1.0 / std::pow(rope.theta, static_cast<double>(2 * i) / head_dim);
  }
  switch (rope.scaling) {
    case RopeScalingType::kNone:
      break;
    case RopeScalingType::kLinear:
      for (double& f : inv_freq_) f /= rope.factor;
      break;
    case RopeScalingType::kLlama3: {
      // Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, a smooth blend
      // between.
      const double old_len = static_cast<double>(rope.original_max_position_embeddings);
      const double low_freq_wavelen = old_len / rope.low_freq_factor;
      const double high_freq_wavelen = old_len / rope.high_freq_factor;
      for (double& f : inv_freq_) {
        const double wavelen = 2 * M_PI / f;
        if (wavelen < high_freq_wavelen) continue;
        if (wavelen > low_freq_wavelen) {
          f /= rope.factor;
        } else {
          const double smooth = (old_len / wavelen - rope.low_freq_factor) /
                                (rope.high_freq_factor - rope.low_freq_factor);
          f = (1 - smooth) * f / rope.factor + smooth * f;
        }
      }
      break;
    }
  }
}

std::pair<at::Tensor, at::Tensor> RotaryEmbedding::Tables(const at::Tensor& positions,
                                                          const at::Tensor& like) const {
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  at::Tensor inv = at::from_blob(const_cast<double*>(inv_freq_.data()),
                                 {static_cast<int64_t>(inv_freq_.size())}, f64);
  at::Tensor angles = at::outer(positions.to(at::kCPU, at::kDouble), inv);  // [T, hd/2]
  const auto out = at::TensorOptions().dtype(like.scalar_type()).device(like.device());
  return {angles.cos().to(out), angles.sin().to(out)};
}

at::Tensor RotaryEmbedding::Rotate(const at::Tensor& x, const at::Tensor& cos,
                                   const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  at::Tensor x1 = x.narrow(-1, 0, half);
  at::Tensor x2 = x.narrow(-1, half, half);
  // rotate_half(x) = [-x2, x1]:  out = x * [cos, cos] + rotate_half(x) * [sin, sin]
  return at::cat({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, -1);
}

at::Tensor RotaryEmbedding::Apply(const at::Tensor& x, const at::Tensor& positions) const {
  auto [cos, sin] = Tables(positions, x);
  return Rotate(x, cos, sin);  // tables [T, hd/2] broadcast over the heads dimension
}

at::Tensor RotaryEmbedding::Invert(const at::Tensor& x, const at::Tensor& positions) const {
  auto [cos, sin] = Tables(positions, x);
  return Rotate(x, cos, -sin);
}

}  // namespace scd
