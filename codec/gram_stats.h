// GramStats: streaming second-order statistics of paired rows (a from the producer, b from the
// consumer): count, sums and the blocks A^T A, A^T B, B^T B, in float64. Everything a translator
// fit needs, in O(d^2) memory however many rows stream through.
// Thread-safety: not thread-safe; one accumulator per writer (Merge combines them).
#ifndef SCD_CODEC_GRAM_STATS_H_
#define SCD_CODEC_GRAM_STATS_H_

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace scd {

class GramStats {
 public:
  GramStats() = default;
  GramStats(int64_t dim_a, int64_t dim_b);
  // Copies are deep: a copy accumulates independently of its source.
  GramStats(const GramStats& other);
  GramStats& operator=(const GramStats& other);
  GramStats(GramStats&&) = default;
  GramStats& operator=(GramStats&&) = default;

  // a: [N, dim_a], b: [N, dim_b] (any float dtype/device; accumulated as float64 on CPU).
  void Add(const at::Tensor& a, const at::Tensor& b);
  void Merge(const GramStats& other);

  int64_t count() const { return count_; }
  int64_t dim_a() const { return dim_a_; }
  int64_t dim_b() const { return dim_b_; }
  at::Tensor mean_a() const;  // [dim_a]
  at::Tensor mean_b() const;  // [dim_b]
  // Centered blocks: sum over rows of (a - mean_a)(...)^T etc.
  at::Tensor CenteredAA() const;
  at::Tensor CenteredAB() const;
  at::Tensor CenteredBB() const;

 private:
  int64_t dim_a_ = 0, dim_b_ = 0, count_ = 0;
  at::Tensor sum_a_, sum_b_, aa_, ab_, bb_;  // float64
};

}  // namespace scd

#endif  // SCD_CODEC_GRAM_STATS_H_
