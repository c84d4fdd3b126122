#include "codec/gram_stats.h"

#include <ATen/ATen.h>

namespace scd {

GramStats::GramStats(int64_t dim_a, int64_t dim_b) : dim_a_(dim_a), dim_b_(dim_b) {
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  sum_a_ = at::zeros({dim_a}, f64);
  sum_b_ = at::zeros({dim_b}, f64);
  aa_ = at::zeros({dim_a, dim_a}, f64);
  ab_ = at::zeros({dim_a, dim_b}, f64);
  bb_ = at::zeros({dim_b, dim_b}, f64);
}

GramStats::GramStats(const GramStats& other) { *this = other; }

GramStats& GramStats::operator=(const GramStats& other) {
  if (this == &other) return *this;
  dim_a_ = other.dim_a_;
  dim_b_ = other.dim_b_;
  count_ = other.count_;
  auto copy = [](const at::Tensor& t) { return t.defined() ? t.clone() : t; };
  sum_a_ = copy(other.sum_a_);
  sum_b_ = copy(other.sum_b_);
  aa_ = copy(other.aa_);
  ab_ = copy(other.ab_);
  bb_ = copy(other.bb_);
  return *this;
}

void GramStats::Add(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor a64 = a.to(at::kCPU, at::kDouble).reshape({-1, dim_a_});
  at::Tensor b64 = b.to(at::kCPU, at::kDouble).reshape({-1, dim_b_});
  count_ += a64.size(0);
  sum_a_.add_(a64.sum(0));
  sum_b_.add_(b64.sum(0));
  aa_.addmm_(a64.t(), a64);
  ab_.addmm_(a64.t(), b64);
  bb_.addmm_(b64.t(), b64);
}

void GramStats::Merge(const GramStats& other) {
  count_ += other.count_;
  sum_a_.add_(other.sum_a_);
  sum_b_.add_(other.sum_b_);
  aa_.add_(other.aa_);
  ab_.add_(other.ab_);
  bb_.add_(other.bb_);
}

at::Tensor GramStats::mean_a() const { return sum_a_ / std::max<int64_t>(count_, 1); }
at::Tensor GramStats::mean_b() const { return sum_b_ / std::max<int64_t>(count_, 1); }

at::Tensor GramStats::CenteredAA() const { return aa_ - count_ * at::outer(mean_a(), mean_a()); }
at::Tensor GramStats::CenteredAB() const { return ab_ - count_ * at::outer(mean_a(), mean_b()); }
at::Tensor GramStats::CenteredBB() const { return bb_ - count_ * at::outer(mean_b(), mean_b()); }

}  // namespace scd
