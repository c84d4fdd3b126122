#include "codec/patch_aligner.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "base/exception_guard.h"

namespace scd {

PatchAligner::PatchAligner(ReuseTranslator basis, at::Tensor z_scale,
                           std::vector<at::Tensor> weights, std::vector<at::Tensor> biases)
    : basis_(std::move(basis)),
      z_scale_(std::move(z_scale)),
      weights_(std::move(weights)),
      biases_(std::move(biases)) {}

absl::StatusOr<PatchAligner> PatchAligner::Create(ReuseTranslator basis, at::Tensor z_scale,
                                                  std::vector<at::Tensor> weights,
                                                  std::vector<at::Tensor> biases) {
  return GuardExceptions("PatchAligner::Create", [&]() -> absl::StatusOr<PatchAligner> {
    if (basis.per_head()) return absl::InvalidArgumentError("a patch basis is a single map");
    if (!z_scale.defined() || z_scale.dim() != 1 || z_scale.size(0) != basis.rank()) {
      return absl::InvalidArgumentError(
          absl::StrCat("aligner z_scale must be [", basis.rank(), "]"));
    }
    if (weights.size() != biases.size()) {
      return absl::InvalidArgumentError("aligner weights and biases differ in count");
    }
    int64_t in = basis.rank();
    for (size_t i = 0; i < weights.size(); ++i) {
      if (weights[i].dim() != 2 || weights[i].size(1) != in || biases[i].dim() != 1 ||
          biases[i].size(0) != weights[i].size(0)) {
        return absl::InvalidArgumentError(
            absl::StrCat("aligner layer ", i, " expects input width ", in, " and a matching bias"));
      }
      in = weights[i].size(0);
    }
    if (!weights.empty() && in != basis.dim_out()) {
      return absl::InvalidArgumentError(
          absl::StrCat("aligner output width ", in, " != hidden size ", basis.dim_out()));
    }
    for (at::Tensor& t : weights) t = t.to(at::kFloat);
    for (at::Tensor& t : biases) t = t.to(at::kFloat);
    return PatchAligner(std::move(basis), z_scale.to(at::kFloat), std::move(weights),
                        std::move(biases));
  });
}

at::Tensor PatchAligner::Encode(const at::Tensor& h_a, int64_t rank) const {
  return basis_.Encode(h_a, rank);
}

at::Tensor PatchAligner::Align(const at::Tensor& z) const {
  at::Tensor zf = z.to(at::kFloat);
  at::Tensor out = basis_.Decode(zf);  // [T, d] linear part, nested in the rank
  if (weights_.empty()) return out;
  if (zf.size(-1) < rank()) zf = at::constant_pad_nd(zf, {0, rank() - zf.size(-1)});
  at::Tensor x = zf / z_scale_;
  for (size_t i = 0; i < weights_.size(); ++i) {
    x = at::addmm(biases_[i], x, weights_[i].t());
    if (i + 1 < weights_.size()) x = at::silu(x);
  }
  return out + x;
}

PatchAligner PatchAligner::To(c10::Device device) const {
  PatchAligner a = *this;
  a.basis_ = basis_.To(device);
  a.z_scale_ = z_scale_.to(device);
  for (at::Tensor& t : a.weights_) t = t.to(device);
  for (at::Tensor& t : a.biases_) t = t.to(device);
  return a;
}

}  // namespace scd
