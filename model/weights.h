// ModelWeights: a Llama-family model's parameters in the runtime's layout. Projections that read
// the same input are fused (q|k|v, gate|up) so a prefill does one large GEMM instead of three;
// the per-projection views (Wk, Wv, ...) that the codec needs stay available.
// Thread-safety: immutable after construction; safe to share.
#ifndef SCD_MODEL_WEIGHTS_H_
#define SCD_MODEL_WEIGHTS_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "model/checkpoint.h"
#include "model/config.h"

namespace scd {

struct LayerWeights {
  at::Tensor attn_norm;  // [d]
  at::Tensor wqkv;       // [q_dim + 2 kv_dim, d]: rows of W_q, then W_k, then W_v
  at::Tensor bqkv;       // [q_dim + 2 kv_dim], undefined without q/k/v bias
  at::Tensor wo;         // [d, q_dim]
  at::Tensor bo;         // [d], undefined without o bias
  at::Tensor mlp_norm;   // [d]
  at::Tensor w_gate_up;  // [2 f, d]: rows of W_gate, then W_up
  at::Tensor b_gate_up;  // [2 f], undefined without mlp bias
  at::Tensor w_down;     // [d, f]
  at::Tensor b_down;     // [d], undefined without mlp bias

  // Views into the fused tensors (no copies). Biases are undefined when the model has none.
  at::Tensor Wq(const ModelConfig& c) const;  // [q_dim, d]
  at::Tensor Wk(const ModelConfig& c) const;  // [kv_dim, d]
  at::Tensor Wv(const ModelConfig& c) const;  // [kv_dim, d]
  at::Tensor Bk(const ModelConfig& c) const;  // [kv_dim]
  at::Tensor Bv(const ModelConfig& c) const;  // [kv_dim]
};

struct ModelWeights {
  at::Tensor embed;       // [V, d]
  at::Tensor final_norm;  // [d]
  at::Tensor lm_head;     // [V, d]; shares storage with `embed` when embeddings are tied
  std::vector<LayerWeights> layers;

  // Loads and validates every tensor's presence and shape against `config`; a tied embedding may
  // be stored under either `model.embed_tokens.weight` or `lm_head.weight`.
  static absl::StatusOr<ModelWeights> Load(const Checkpoint& checkpoint, const ModelConfig& config,
                                           c10::ScalarType dtype, c10::Device device);
  // Seeded random weights (normal(0, 0.02), unit norms) for speed work on configs without weights.
  static ModelWeights Dummy(const ModelConfig& config, uint64_t seed, c10::ScalarType dtype,
                            c10::Device device);
};

}  // namespace scd

#endif  // SCD_MODEL_WEIGHTS_H_
