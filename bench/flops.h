// FLOP accounting for a Llama-family forward pass: the GEMMs (2 FLOPs per multiply-add) and the
// attention products QK^T and PV over the keys each query can see; elementwise work is ignored.
#ifndef SCD_BENCH_FLOPS_H_
#define SCD_BENCH_FLOPS_H_

#include <algorithm>
#include <cstdint>

#include "model/config.h"

namespace scd {

// `new_tokens` run after `context` cached positions; `logits_rows` rows go through the LM head.
inline double ForwardFlops(const ModelConfig& c, int64_t new_tokens, int64_t context,
                           int64_t logits_rows) {
  const double d = static_cast<double>(c.hidden_size);
  const double per_token_layer =
      2.0 * (d * (c.q_dim() + 2.0 * c.kv_dim()) + c.q_dim() * d + 3.0 * d * c.intermediate_size);
  double visible_keys = 0;  // summed over the new tokens
  for (int64_t t = 0; t < new_tokens; ++t) {
    int64_t keys = context + t + 1;
    if (c.sliding_window) keys = std::min(keys, *c.sliding_window);
    visible_keys += static_cast<double>(keys);
  }
  const double attention_per_layer = 4.0 * c.num_heads * c.head_dim * visible_keys;
  return c.num_layers * (per_token_layer * new_tokens + attention_per_layer) +
         2.0 * d * c.vocab_size * logits_rows;
}

}  // namespace scd

#endif  // SCD_BENCH_FLOPS_H_
