#include "model/sampler.h"

#include <ATen/ATen.h>
#include <ATen/core/PhiloxRNGEngine.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace scd {

absl::Status SamplingParams::Validate() const {
  if (!(temperature >= 0) || std::isinf(temperature)) {
    return absl::InvalidArgumentError(absl::StrCat("temperature must be >= 0, got ", temperature));
  }
  if (top_k < 0) return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 0, got ", top_k));
  if (!(top_p > 0 && top_p <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("top_p must be in (0, 1], got ", top_p));
  }
  return absl::OkStatus();
}

Sampler::Sampler(const SamplingParams& params) : params_(params) {}

double Sampler::Uniform(uint64_t seed, int64_t position) {
  at::Philox4_32 engine(seed, static_cast<uint64_t>(position), /*offset=*/0);
  const uint64_t high = engine();
  const uint64_t low = engine();
  return static_cast<double>(((high << 32) | low) >> 11) * 0x1.0p-53;
}

TokenId Sampler::Sample(const at::Tensor& logits, int64_t position) {
  at::Tensor row = logits.reshape({-1}).to(at::kCPU, at::kFloat).contiguous();
  const float* data = row.data_ptr<float>();
  const int64_t n = row.numel();
  if (params_.temperature == 0.0f) {
    return static_cast<TokenId>(std::max_element(data, data + n) - data);  // first maximum
  }
  // Candidates sorted by logit, descending; top-k cuts the list before any softmax work.
  order_.resize(n);
  std::iota(order_.begin(), order_.end(), 0);
  const int64_t k = params_.top_k > 0 ? std::min<int64_t>(params_.top_k, n) : n;
  auto by_logit = [data](int32_t a, int32_t b) {
    return data[a] > data[b] || (data[a] == data[b] && a < b);
  };
  std::partial_sort(order_.begin(), order_.begin() + k, order_.end(), by_logit);
  order_.resize(k);
  scratch_.resize(k);
  const float max_logit = data[order_[0]];
  double total = 0;
  for (int64_t i = 0; i < k; ++i) {
    scratch_[i] = std::exp((data[order_[i]] - max_logit) / params_.temperature);
    total += scratch_[i];
  }
  int64_t keep = k;
  if (params_.top_p < 1.0f) {
    double cumulative = 0;
    for (int64_t i = 0; i < k; ++i) {
      cumulative += scratch_[i] / total;
      if (cumulative >= params_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double kept_total = 0;
  for (int64_t i = 0; i < keep; ++i) kept_total += scratch_[i];
  double r = Uniform(params_.seed, position) * kept_total;
  for (int64_t i = 0; i < keep; ++i) {
    r -= scratch_[i];
    if (r < 0) return order_[i];
  }
  return order_[keep - 1];
}

}  // namespace scd
