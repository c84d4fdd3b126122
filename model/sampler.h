// Sampler: picks the next token from logits: greedy, or temperature with top-k / top-p
// (nucleus) filtering. A sampled token depends only on (seed, position, logits): its uniform draw
// is Philox4x32-10 (ATen's `at::Philox4_32`, the generator cuRAND and JAX use) keyed by the seed
// at a counter of the token's position, not the next value of a stream. So a sequence continued
// elsewhere from its first k tokens (a moved request) draws what it would have drawn unmoved.
// Thread-safety: not thread-safe (scratch buffers); use one per sequence.
#ifndef SCD_MODEL_SAMPLER_H_
#define SCD_MODEL_SAMPLER_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
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

  // logits: [vocab] (or [1, vocab]) on any device/dtype; `position`: the position the sampled
  // token will take in its sequence (the positions before it: prompt plus earlier outputs).
  TokenId Sample(const at::Tensor& logits, int64_t position);

  // The uniform draw in [0, 1) for (seed, position): the first two 32-bit words of Philox4x32-10
  // with key = seed and counter = (0, 0, position), 53 bits of them.
  static double Uniform(uint64_t seed, int64_t position);

 private:
  SamplingParams params_;
  std::vector<float> scratch_;
  std::vector<int32_t> order_;
};

}  // namespace scd

#endif  // SCD_MODEL_SAMPLER_H_
