// Perplexity of a model on token sequences (teacher-forced, every position after the first
// predicted: exp of the mean negative log-likelihood), and the greedy tokens two runtimes of one
// checkpoint agree on -- how a weight precision (model/packed_weight.h) is judged against float32
// (`scd-calib quality`, tests/precision_quality_test.cc).
// Thread-safety: reads the model only.
#ifndef SCD_CALIB_PERPLEXITY_H_
#define SCD_CALIB_PERPLEXITY_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "model/llama_model.h"

namespace scd {

struct PerplexityResult {
  double ppl = 0;
  double nll = 0;       // mean negative log-likelihood, nats
  int64_t tokens = 0;   // positions scored
};

absl::StatusOr<PerplexityResult> Perplexity(const LlamaModel& model,
                                            const std::vector<std::vector<TokenId>>& sequences);

// `tokens` greedy tokens after each prompt.
absl::StatusOr<std::vector<std::vector<TokenId>>> GreedyContinuations(
    const LlamaModel& model, const std::vector<std::vector<TokenId>>& prompts, int tokens);

// Share of positions where two continuations of the same prompts hold the same token, and how many
// prompts' continuations are equal throughout.
struct GreedyAgreement {
  double positions = 0;
  int identical = 0, prompts = 0;
};
GreedyAgreement CompareGreedy(const std::vector<std::vector<TokenId>>& a,
                              const std::vector<std::vector<TokenId>>& b);

}  // namespace scd

#endif  // SCD_CALIB_PERPLEXITY_H_
