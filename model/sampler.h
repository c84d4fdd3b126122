// Sampler: picks the next token from logits: greedy, or temperature with top-k / top-p
// (nucleus) filtering, driven by its own seeded generator so a seed reproduces a run exactly.
// Thread-safety: not thread-safe (holds generator state); use one per sequence.
#ifndef SCD_MODEL_SAMPLER_H_
#define SCD_MODEL_SAMPLER_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "base/token_id.h"

namespace scd {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy (argmax, lowest index on ties)
  int top_k = 0;             // keep the k most likely tokens; 0 = off
  float top_p = 1.0f;        // keep the smallest set with cumulative probability >= top_p
  uint64_t seed = 0;

  absl::Status Validate() const;
};

class Sampler {
 public:
  // REQUIRES: params.Validate().ok()
  explicit Sampler(const SamplingParams& params);

  // logits: [vocab] (or [1, vocab]) on any device/dtype.
  TokenId Sample(const at::Tensor& logits);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<float> scratch_;
  std::vector<int32_t> order_;
};

}  // namespace scd

#endif  // SCD_MODEL_SAMPLER_H_
