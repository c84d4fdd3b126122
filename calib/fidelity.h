// FidelityEvaluator (method.md, Fidelity): how close a consumer that got its prefix cache
// through some transfer stays to the oracle (its own full prefill). For each window of
// prefix + continuation tokens, a builder fills the consumer's cache for the prefix; the
// continuation is then teacher-forced and compared with the oracle at every continuation
// position: KL(oracle || mode), total variation, top-1 agreement, continuation perplexity; and
// greedy decoding from the same point is compared token by token.
// Thread-safety: immutable after Create(); Evaluate is const but uses the consumer model.
#ifndef SCD_CALIB_FIDELITY_H_
#define SCD_CALIB_FIDELITY_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/llama_model.h"

namespace scd {

struct FidelityOptions {
  int prefix = 64;         // tokens the transfer covers
  int continuation = 32;   // teacher-forced tokens scored after it
  int greedy_tokens = 32;  // greedy continuation compared with the oracle's (0: skip)
};

struct FidelityMetrics {
  double kl = 0;                // mean KL(oracle || mode) per continuation position, nats
  double tv = 0;                // mean total variation distance
  double top1 = 0;              // share of positions whose argmax agrees with the oracle's
  double ppl = 0;               // continuation perplexity under the mode
  double oracle_ppl = 0;        // ... and under the oracle
  double greedy_agreement = 0;  // share of greedy tokens equal to the oracle's, position-wise
  double bytes_per_token = 0;   // payload per prefix token
  int64_t positions = 0, windows = 0;

  double ppl_ratio() const { return oracle_ppl > 0 ? ppl / oracle_ppl : 0; }
};

// Fills an empty consumer cache with window `window`'s prefix; reports the payload bytes.
using PrefixCacheBuilder =
    std::function<absl::Status(int window, KvCache* cache, int64_t* payload_bytes)>;

class FidelityEvaluator {
 public:
  // Each window must hold prefix + continuation + 1 tokens. Computes the oracle once.
  static absl::StatusOr<FidelityEvaluator> Create(const LlamaModel& consumer,
                                                  std::vector<std::vector<TokenId>> windows,
                                                  const FidelityOptions& options);

  absl::StatusOr<FidelityMetrics> Evaluate(const PrefixCacheBuilder& build, bool greedy) const;
  // Relative l2 error of each layer's attention input on the continuation tokens, over all
  // windows: ||H_mode - H_oracle|| / ||H_oracle|| (the paper's Fig. 6).
  absl::StatusOr<std::vector<double>> DepthErrors(const PrefixCacheBuilder& build) const;

  const std::vector<std::vector<TokenId>>& windows() const { return windows_; }
  const FidelityOptions& options() const { return options_; }
  // The window's prefix tokens.
  std::vector<TokenId> Prefix(int window) const;

 private:
  FidelityEvaluator(const LlamaModel& consumer, std::vector<std::vector<TokenId>> windows,
                    FidelityOptions options);

  const LlamaModel* consumer_;
  std::vector<std::vector<TokenId>> windows_;
  FidelityOptions options_;
  std::vector<at::Tensor> oracle_log_probs_;  // per window [continuation, vocab] float32
  std::vector<std::vector<TokenId>> oracle_greedy_;
  std::vector<at::Tensor> oracle_attn_inputs_;  // per window [layers, continuation, hidden]
  double oracle_nll_ = 0;
};

}  // namespace scd

#endif  // SCD_CALIB_FIDELITY_H_
