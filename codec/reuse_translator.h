// ReuseTranslator: a rank-r linear map from producer rows to consumer rows (method.md, Reuse):
//   producer   z   = (x_A - mu_A) W_enc        r numbers per row: what travels
//   consumer   x_B ~  z W_dec + mu_B
// Rows are (kv head, token) pairs of pre-RoPE keys or values, or tokens of an attention input.
// One map may be shared by all kv heads of a layer or kept per head. Codes are nested: columns
// are ordered by importance, so the first r' < r columns of a code decode as a rank-r' code.
// Per-head maps may be *folded* (FoldHeads): one map over whole tokens (all kv heads' rows side
// by side), block-diagonal, whose columns are every head's columns in one order of importance
// across heads. A folded code of rank r is then each head's code at its own rank (HeadRanks):
// per-head ranks that stay nested, on a wire that carries one rank per layer.
// Thread-safety: immutable after Fit(); safe to share.
#ifndef SCD_CODEC_REUSE_TRANSLATOR_H_
#define SCD_CODEC_REUSE_TRANSLATOR_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "codec/gram_stats.h"

namespace scd {

enum class FitMethod {
  kRrr,       // reduced-rank ridge regression: optimal for ||B - A W_enc W_dec||^2 + ridge
  kJointSvd,  // the paper's: top-r subspace of [A | B], ridge encoder onto its latents
  kPca,       // top-r principal subspace of A, ridge decoder (a producer-only basis)
};
std::string FitMethodName(FitMethod method);
absl::StatusOr<FitMethod> ParseFitMethod(const std::string& name);

struct TranslatorFitOptions {
  FitMethod method = FitMethod::kRrr;
  // Rank to keep; 0 chooses the smallest rank whose spectrum share reaches `energy`.
  int64_t rank = 0;
  double energy = 0.99;
  // Ridge lambda relative to the mean variance of A: lambda = ridge * trace(A^T A) / dim_a.
  double ridge = 1e-4;
};

class ReuseTranslator {
 public:
  ReuseTranslator() = default;
  // One GramStats per map: a single one for a shared map, kv_heads of them for per-head maps.
  static absl::StatusOr<ReuseTranslator> Fit(const std::vector<GramStats>& grams,
                                             const TranslatorFitOptions& options);
  // From stored tensors (artifact loading). Shapes: mu_a [maps, d_in], mu_b [maps, d_out],
  // w_enc [maps, d_in, r], w_dec [maps, r, d_out].
  // `column_heads` (folded maps only: maps 1, d_in and d_out `heads` times a head's) names
  // each code column's head; empty for an unfolded map.
  static absl::StatusOr<ReuseTranslator> FromTensors(at::Tensor mu_a, at::Tensor mu_b,
                                                     at::Tensor w_enc, at::Tensor w_dec,
                                                     std::vector<int> column_heads = {},
                                                     int64_t heads = 0);
  // `per_head`'s maps (one per head, `heads` > 1) folded into one map over whole tokens whose
  // code column c is column j of head column_heads[c], j counting that head's earlier columns:
  // every head's columns must appear, in their own order (a head's j-th column before its
  // (j+1)-th). At full rank the folded map sends and rebuilds what the per-head maps do.
  static absl::StatusOr<ReuseTranslator> FoldHeads(const ReuseTranslator& per_head,
                                                   const std::vector<int>& column_heads);

  int64_t rank() const { return w_enc_.size(2); }
  int64_t maps() const { return w_enc_.size(0); }
  int64_t dim_in() const { return w_enc_.size(1); }
  int64_t dim_out() const { return w_dec_.size(2); }
  bool per_head() const { return maps() > 1; }
  // Folded (FoldHeads): codes are [1, T, r] for a token's every head; else [heads, T, r].
  bool folded() const { return !column_heads_.empty(); }
  int64_t folded_heads() const { return folded_heads_; }
  const std::vector<int>& column_heads() const { return column_heads_; }
  // Code rows per token on the wire for a layer of `kv_heads`: 1 when folded.
  int64_t CodeRows(int64_t kv_heads) const { return folded() ? 1 : kv_heads; }
  // Each head's own rank within a code of `rank` columns (folded: counted from column_heads;
  // else `rank` for every one of `heads`).
  std::vector<int64_t> HeadRanks(int64_t rank, int64_t heads) const;

  // x: [heads, T, d_in] (or [T, d_in] for a single map) -> codes [..., T, rank] (rank <= rank()).
  // Folded: x [heads, T, d_in / heads] -> [1, T, rank].
  at::Tensor Encode(const at::Tensor& x, int64_t rank) const;
  // z: [..., T, r] with r <= rank() -> [..., T, d_out]. Uses the first r rows of W_dec.
  // Folded: z [1, T, r] -> [heads, T, d_out / heads].
  at::Tensor Decode(const at::Tensor& z) const;
  // The map keeping only the first `rank` code columns.
  ReuseTranslator Truncated(int64_t rank) const;
  // Same translator with float32 tensors on `device`.
  ReuseTranslator To(c10::Device device) const;

  const at::Tensor& mu_a() const { return mu_a_; }
  const at::Tensor& mu_b() const { return mu_b_; }
  const at::Tensor& w_enc() const { return w_enc_; }
  const at::Tensor& w_dec() const { return w_dec_; }
  // Spectrum the rank was chosen from (per map, descending), for reports.
  const std::vector<std::vector<double>>& spectrum() const { return spectrum_; }

 private:
  absl::Status SetColumnHeads(std::vector<int> column_heads, int64_t heads);

  at::Tensor mu_a_, mu_b_, w_enc_, w_dec_;  // float32, see FromTensors
  std::vector<int> column_heads_;           // folded: each column's head; else empty
  int64_t folded_heads_ = 1;
  std::vector<std::vector<double>> spectrum_;
};

// Rank whose cumulative share of `spectrum` (descending, non-negative) first reaches `energy`.
int64_t RankForEnergy(const std::vector<double>& spectrum, double energy);

}  // namespace scd

#endif  // SCD_CODEC_REUSE_TRANSLATOR_H_
