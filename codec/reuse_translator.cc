#include "codec/reuse_translator.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/exception_guard.h"
#include "base/status_macros.h"

namespace scd {
namespace {

struct MapFit {
  at::Tensor mu_a, mu_b, w_enc, w_dec;  // float64: [d_in], [d_out], [d_in, r_max], [r_max, d_out]
  std::vector<double> spectrum;         // descending
};

// Eigen-decomposition of a symmetric matrix with eigenpairs sorted by descending eigenvalue.
std::pair<at::Tensor, at::Tensor> EighDescending(const at::Tensor& m) {
  auto [values, vectors] = at::linalg_eigh((m + m.t()) / 2);
  return {values.flip(0), vectors.flip(1)};
}

std::vector<double> ToVector(const at::Tensor& t) {
  at::Tensor c = t.to(at::kCPU, at::kDouble).clamp_min(0).contiguous();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

MapFit FitOne(const GramStats& g, FitMethod method, double ridge) {
  const int64_t d_in = g.dim_a(), d_out = g.dim_b();
  const at::Tensor saa = g.CenteredAA(), sab = g.CenteredAB();
  const double lambda = std::max(ridge * saa.trace().item<double>() / d_in, 1e-12);
  const at::Tensor reg = saa + lambda * at::eye(d_in, saa.options());
  MapFit fit;
  fit.mu_a = g.mean_a();
  fit.mu_b = g.mean_b();
  switch (method) {
    case FitMethod::kRrr: {
      // Ridge solution, then the top right singular vectors of the (augmented) fitted values:
      // W_ols^T (A^T A + lambda I) W_ols = W_ols^T A^T B.
      at::Tensor w_ols = at::linalg_solve(reg, sab);  // [d_in, d_out]
      auto [values, vectors] = EighDescending(w_ols.t().mm(sab));
      fit.w_enc = w_ols.mm(vectors);  // [d_in, d_out]
      fit.w_dec = vectors.t();        // [d_out, d_out]
      fit.spectrum = ToVector(values);
      break;
    }
    case FitMethod::kJointSvd: {
      at::Tensor joint =
          at::cat({at::cat({saa, sab}, 1), at::cat({sab.t(), g.CenteredBB()}, 1)}, 0);
      auto [values, vectors] = EighDescending(joint);  // [d_in + d_out] eigenpairs
      const int64_t r = std::min(d_in, d_out);
      at::Tensor v = vectors.narrow(1, 0, r);
      at::Tensor v_a = v.narrow(0, 0, d_in), v_b = v.narrow(0, d_in, d_out);
      // Latents Z = A v_a + B v_b; encoder = ridge regression of Z on A.
      fit.w_enc = at::linalg_solve(reg, saa.mm(v_a) + sab.mm(v_b));  // [d_in, r]
      fit.w_dec = v_b.t();                                           // [r, d_out]
      fit.spectrum = ToVector(values.narrow(0, 0, r));
      break;
    }
    case FitMethod::kPca: {
      auto [values, vectors] = EighDescending(saa);
      const int64_t r = std::min(d_in, d_out);
      at::Tensor v = vectors.narrow(1, 0, r);  // [d_in, r]
      // Codes are uncorrelated here, so the ridge decoder is column-separable (hence nested).
      at::Tensor zz = v.t().mm(saa).mm(v);
      fit.w_enc = v;
      fit.w_dec = at::linalg_solve(zz + lambda * at::eye(r, zz.options()), v.t().mm(sab));
      fit.spectrum = ToVector(values.narrow(0, 0, r));
      break;
    }
  }
  return fit;
}

}  // namespace

std::string FitMethodName(FitMethod method) {
  switch (method) {
    case FitMethod::kRrr:
      return "rrr";
    case FitMethod::kJointSvd:
      return "joint-svd";
    case FitMethod::kPca:
      return "pca";
  }
  return "?";
}

absl::StatusOr<FitMethod> ParseFitMethod(const std::string& name) {
  for (FitMethod m : {FitMethod::kRrr, FitMethod::kJointSvd, FitMethod::kPca}) {
    if (FitMethodName(m) == name) return m;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("fit method '", name, "' is not one of rrr, joint-svd, pca"));
}

int64_t RankForEnergy(const std::vector<double>& spectrum, double energy) {
  double total = 0;
  for (double s : spectrum) total += s;
  if (total <= 0) return 1;
  double cumulative = 0;
  for (size_t i = 0; i < spectrum.size(); ++i) {
    cumulative += spectrum[i];
    if (cumulative >= energy * total) return static_cast<int64_t>(i + 1);
  }
  return static_cast<int64_t>(spectrum.size());
}

absl::StatusOr<ReuseTranslator> ReuseTranslator::Fit(const std::vector<GramStats>& grams,
                                                     const TranslatorFitOptions& options) {
  return GuardExceptions("ReuseTranslator::Fit", [&]() -> absl::StatusOr<ReuseTranslator> {
    if (grams.empty()) return absl::InvalidArgumentError("no statistics to fit a translator from");
    for (const GramStats& g : grams) {
      if (g.count() < 2) {
        return absl::FailedPreconditionError(
            absl::StrCat("a translator needs paired rows; got ", g.count()));
      }
    }
    std::vector<MapFit> fits;
    for (const GramStats& g : grams) fits.push_back(FitOne(g, options.method, options.ridge));
    // One rank for all maps of a layer: the largest any map needs for the requested energy.
    const int64_t max_rank = fits[0].w_enc.size(1);
    int64_t rank = options.rank;
    if (rank <= 0) {
      rank = 1;
      for (const MapFit& f : fits) rank = std::max(rank, RankForEnergy(f.spectrum, options.energy));
    }
    rank = std::min(rank, max_rank);
    ReuseTranslator t;
    std::vector<at::Tensor> mu_a, mu_b, enc, dec;
    for (const MapFit& f : fits) {
      mu_a.push_back(f.mu_a);
      mu_b.push_back(f.mu_b);
      enc.push_back(f.w_enc.narrow(1, 0, rank));
      dec.push_back(f.w_dec.narrow(0, 0, rank));
      t.spectrum_.push_back(f.spectrum);
    }
    t.mu_a_ = at::stack(mu_a).to(at::kFloat);
    t.mu_b_ = at::stack(mu_b).to(at::kFloat);
    t.w_enc_ = at::stack(enc).to(at::kFloat).contiguous();
    t.w_dec_ = at::stack(dec).to(at::kFloat).contiguous();
    return t;
  });
}

absl::StatusOr<ReuseTranslator> ReuseTranslator::FromTensors(at::Tensor mu_a, at::Tensor mu_b,
                                                             at::Tensor w_enc, at::Tensor w_dec,
                                                             std::vector<int> column_heads,
                                                             int64_t heads) {
  return GuardExceptions("ReuseTranslator::FromTensors", [&]() -> absl::StatusOr<ReuseTranslator> {
    if (mu_a.dim() != 2 || mu_b.dim() != 2 || w_enc.dim() != 3 || w_dec.dim() != 3) {
      return absl::InvalidArgumentError(
          "translator tensors must be mu [maps, d] and W [maps, ., .]");
    }
    const int64_t maps = w_enc.size(0);
    if (mu_a.size(0) != maps || mu_b.size(0) != maps || w_dec.size(0) != maps ||
        mu_a.size(1) != w_enc.size(1) || w_enc.size(2) != w_dec.size(1) ||
        mu_b.size(1) != w_dec.size(2)) {
      return absl::InvalidArgumentError(
          absl::StrCat("translator tensor shapes disagree: mu_a ", mu_a.sizes().vec().size(),
                       "-d, w_enc [", w_enc.size(0), ", ", w_enc.size(1), ", ", w_enc.size(2),
                       "], w_dec [", w_dec.size(0), ", ", w_dec.size(1), ", ", w_dec.size(2), "]"));
    }
    ReuseTranslator t;
    t.mu_a_ = mu_a.to(at::kFloat);
    t.mu_b_ = mu_b.to(at::kFloat);
    t.w_enc_ = w_enc.to(at::kFloat).contiguous();
    t.w_dec_ = w_dec.to(at::kFloat).contiguous();
    if (!column_heads.empty())
      SCD_RETURN_IF_ERROR(t.SetColumnHeads(std::move(column_heads), heads));
    return t;
  });
}

absl::Status ReuseTranslator::SetColumnHeads(std::vector<int> column_heads, int64_t heads) {
  const int64_t d_in = dim_in(), d_out = dim_out(), r = rank();
  if (maps() != 1 || heads < 2 || d_in % heads != 0 || d_out % heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("a folded map needs one map whose ", d_in,
                                                   " -> ", d_out, " dims split into ", heads,
                                                   " heads"));
  }
  if (static_cast<int64_t>(column_heads.size()) != r) {
    return absl::InvalidArgumentError(
        absl::StrCat("a folded map of rank ", r, " names ", column_heads.size(), " column heads"));
  }
  // Block-diagonal: column c reads and writes its own head's dims only.
  at::Tensor enc_mask = at::zeros({d_in, r}), dec_mask = at::zeros({r, d_out});
  const int64_t a = d_in / heads, b = d_out / heads;
  for (int64_t c = 0; c < r; ++c) {
    const int h = column_heads[static_cast<size_t>(c)];
    if (h < 0 || h >= heads) {
      return absl::InvalidArgumentError(
          absl::StrCat("folded column ", c, " names head ", h, " of ", heads));
    }
    enc_mask.narrow(0, h * a, a).select(1, c).fill_(1);
    dec_mask.select(0, c).narrow(0, h * b, b).fill_(1);
  }
  const at::Tensor enc = w_enc_[0].cpu(), dec = w_dec_[0].cpu();
  if ((enc * (1 - enc_mask)).abs().max().item<float>() != 0 ||
      (dec * (1 - dec_mask)).abs().max().item<float>() != 0) {
    return absl::InvalidArgumentError("a folded map mixes heads (weights outside its head blocks)");
  }
  column_heads_ = std::move(column_heads);
  folded_heads_ = heads;
  return absl::OkStatus();
}

absl::StatusOr<ReuseTranslator> ReuseTranslator::FoldHeads(const ReuseTranslator& per_head,
                                                           const std::vector<int>& column_heads) {
  return GuardExceptions("ReuseTranslator::FoldHeads", [&]() -> absl::StatusOr<ReuseTranslator> {
    const int64_t heads = per_head.maps(), a = per_head.dim_in(), b = per_head.dim_out();
    if (heads < 2 || per_head.folded()) {
      return absl::InvalidArgumentError("only per-head maps fold");
    }
    if (static_cast<int64_t>(column_heads.size()) != heads * per_head.rank()) {
      return absl::InvalidArgumentError(absl::StrCat("folding ", heads, " maps of rank ",
                                                     per_head.rank(), " names ",
                                                     column_heads.size(), " columns"));
    }
    const int64_t r = heads * per_head.rank();
    at::Tensor enc = at::zeros({heads * a, r}), dec = at::zeros({r, heads * b});
    std::vector<int64_t> next(static_cast<size_t>(heads), 0);
    for (int64_t c = 0; c < r; ++c) {
      const int h = column_heads[static_cast<size_t>(c)];
      if (h < 0 || h >= heads) {
        return absl::InvalidArgumentError(absl::StrCat("column ", c, " names head ", h));
      }
      const int64_t j = next[static_cast<size_t>(h)]++;
      if (j >= per_head.rank()) {
        return absl::InvalidArgumentError(
            absl::StrCat("head ", h, " is named more than its ", per_head.rank(), " columns"));
      }
      enc.narrow(0, h * a, a).select(1, c).copy_(per_head.w_enc_[h].select(1, j).cpu());
      dec.select(0, c).narrow(0, h * b, b).copy_(per_head.w_dec_[h][j].cpu());
    }
    return FromTensors(per_head.mu_a_.reshape({1, heads * a}).cpu(),
                       per_head.mu_b_.reshape({1, heads * b}).cpu(), enc.unsqueeze(0),
                       dec.unsqueeze(0), column_heads, heads);
  });
}

std::vector<int64_t> ReuseTranslator::HeadRanks(int64_t rank, int64_t heads) const {
  if (!folded())
    return std::vector<int64_t>(static_cast<size_t>(heads), std::min(rank, this->rank()));
  std::vector<int64_t> out(static_cast<size_t>(folded_heads_), 0);
  for (int64_t c = 0; c < std::min(rank, this->rank()); ++c) ++out[column_heads_[c]];
  return out;
}

namespace {

// a [heads, T, k] times each head's map (w [maps, k, n], maps 1 or heads) as one 2-D GEMM per
// head: a batched matmul of few rows takes ATen's own small-matrix loop instead of BLAS, so a
// row's result would depend on how many rows came with it -- and a cache rebuilt in pieces
// (codec/layerwise_rebuilder.h) would differ from one rebuilt whole.
at::Tensor PerHeadMatmul(const at::Tensor& a, const at::Tensor& w) {
  const int64_t heads = std::max(a.size(0), w.size(0));  // either side may broadcast
  std::vector<at::Tensor> out;
  out.reserve(static_cast<size_t>(heads));
  for (int64_t h = 0; h < heads; ++h) {
    out.push_back(at::mm(a[a.size(0) == 1 ? 0 : h], w[w.size(0) == 1 ? 0 : h]));
  }
  return at::stack(out);
}

}  // namespace

at::Tensor ReuseTranslator::Encode(const at::Tensor& x, int64_t rank) const {
  if (folded()) {  // [heads, T, d] -> one row per token, every head's dims side by side
    const int64_t t = x.size(1);
    at::Tensor rows = x.to(at::kFloat).transpose(0, 1).reshape({t, dim_in()}) - mu_a_;
    at::Tensor z = at::mm(rows, w_enc_[0]);
    if (rank < this->rank()) z = z.narrow(-1, 0, rank).contiguous();
    return z.unsqueeze(0);
  }
  // Shared map: [1, d_in, r] broadcasts over heads; per-head maps pair up with x's head dim.
  // Every column, then the first `rank`: a lower rank's codes are then exactly a prefix of a
  // higher rank's, bit for bit (a GEMM of another width may round differently), so a chunk cut
  // to a lower rank in flight (LowerChunkRank) is what an encode at that rank sends.
  const bool single = x.dim() == 2;
  at::Tensor xs = single ? x.unsqueeze(0) : x;  // [heads, T, d_in]
  at::Tensor z = PerHeadMatmul(xs.to(at::kFloat) - mu_a_.unsqueeze(1), w_enc_);
  if (rank < this->rank()) z = z.narrow(-1, 0, rank).contiguous();
  return single ? z.squeeze(0) : z;
}

at::Tensor ReuseTranslator::Decode(const at::Tensor& z) const {
  if (folded()) {  // [1, T, r] -> [heads, T, d_out / heads]
    const int64_t t = z.size(-2);
    at::Tensor x =
        at::mm(z.reshape({t, z.size(-1)}).to(at::kFloat), w_dec_[0].narrow(0, 0, z.size(-1))) +
        mu_b_;
    return x.reshape({t, folded_heads_, dim_out() / folded_heads_}).transpose(0, 1).contiguous();
  }
  const bool single = z.dim() == 2;
  at::Tensor zs = single ? z.unsqueeze(0) : z;
  at::Tensor x =
      PerHeadMatmul(zs.to(at::kFloat), w_dec_.narrow(1, 0, zs.size(-1))) + mu_b_.unsqueeze(1);
  return single ? x.squeeze(0) : x;
}

ReuseTranslator ReuseTranslator::Truncated(int64_t rank) const {
  ReuseTranslator t = *this;
  rank = std::min(rank, this->rank());
  t.w_enc_ = w_enc_.narrow(2, 0, rank).contiguous();
  t.w_dec_ = w_dec_.narrow(1, 0, rank).contiguous();
  if (folded()) t.column_heads_.resize(static_cast<size_t>(rank));
  return t;
}

ReuseTranslator ReuseTranslator::To(c10::Device device) const {
  ReuseTranslator t = *this;
  t.mu_a_ = mu_a_.to(device);
  t.mu_b_ = mu_b_.to(device);
  t.w_enc_ = w_enc_.to(device);
  t.w_dec_ = w_dec_.to(device);
  return t;
}

}  // namespace scd
