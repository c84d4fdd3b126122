// PatchAligner (method.md, Patch): the producer sends a rank-r_H code of its attention input H_A;
// the consumer predicts its own attention input H_B from it and regenerates native K/V with its
// own W_k/W_v. The prediction is the basis's linear decode plus an MLP correction:
//   z   = (H_A - mu_A) W_enc                                   (producer, ReuseTranslator basis)
//   H_B ~ z W_dec + mu_B + MLP(z / z_scale)                     (consumer)
// The MLP's last layer starts at zero, so an untrained aligner is the linear one.
// Thread-safety: immutable after construction; safe to share.
#ifndef SCD_CODEC_PATCH_ALIGNER_H_
#define SCD_CODEC_PATCH_ALIGNER_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "codec/reuse_translator.h"

namespace scd {

struct AlignerShape {
  int64_t width = 512;  // hidden units per MLP layer
  int64_t depth = 2;    // hidden layers (0: linear aligner only)
};

class PatchAligner {
 public:
  PatchAligner() = default;
  // `weights[i]` is [out, in], `biases[i]` [out]: depth + 1 layers, SiLU between them.
  // REQUIRES: shapes chain from basis.rank() to basis.dim_out(); z_scale is [basis.rank()].
  PatchAligner(ReuseTranslator basis, at::Tensor z_scale, std::vector<at::Tensor> weights,
               std::vector<at::Tensor> biases);
  static absl::StatusOr<PatchAligner> Create(ReuseTranslator basis, at::Tensor z_scale,
                                             std::vector<at::Tensor> weights,
                                             std::vector<at::Tensor> biases);

  // Producer: H_A [T, d] -> code [T, rank] (rank <= this->rank()).
  at::Tensor Encode(const at::Tensor& h_a, int64_t rank) const;
  // Consumer: code [T, r] (r <= rank(); missing columns read as zero) -> predicted H_B [T, d].
  at::Tensor Align(const at::Tensor& z) const;

  int64_t rank() const { return basis_.rank(); }
  int64_t depth() const { return static_cast<int64_t>(weights_.size()) - 1; }
  const ReuseTranslator& basis() const { return basis_; }
  const at::Tensor& z_scale() const { return z_scale_; }
  const std::vector<at::Tensor>& weights() const { return weights_; }
  const std::vector<at::Tensor>& biases() const { return biases_; }
  PatchAligner To(c10::Device device) const;

 private:
  ReuseTranslator basis_;
  at::Tensor z_scale_;                        // [rank]
  std::vector<at::Tensor> weights_, biases_;  // empty: linear only
};

}  // namespace scd

#endif  // SCD_CODEC_PATCH_ALIGNER_H_
