// ModelWeights: a Llama-family model's parameters in the runtime's layout. Projections that read
// the same input are fused (q|k|v, gate|up) so a prefill does one large GEMM instead of three;
// the per-projection views (Wk, Wv, ...) that the codec needs stay available.
// Below float32 on a CPU (WeightFormat bf16, f16, int8) every projection, the LM head and the
// embedding table are held packed for the runtime's kernels (model/packed_weight.h), each packed as
// soon as it is loaded so the float32 model is never in memory whole; the dense tensors of a packed
// matrix are then undefined. Matrices live on 2 MiB pages where Linux gives them
// (model/huge_pages.h): a decode step streams them all.
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
#include "model/packed_weight.h"

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
  // The projections packed (the dense tensors above undefined), or empty.
  PackedWeight packed_qkv, packed_o, packed_gate_up, packed_down;

  // Replaces the dense projections with packed ones. REQUIRES: format is not kDense.
  void Pack(WeightFormat format);
  // Moves the dense projections onto 2 MiB pages (model/huge_pages.h).
  void MoveOntoHugePages();

  // Views into the fused tensors (no copies; packed: float32 copies of what the kernels multiply
  // by, PackedWeight::Unpack). Biases are undefined when the model has none.
  at::Tensor Wq(const ModelConfig& c) const;  // [q_dim, d]
  at::Tensor Wk(const ModelConfig& c) const;  // [kv_dim, d]
  at::Tensor Wv(const ModelConfig& c) const;  // [kv_dim, d]
  at::Tensor Bk(const ModelConfig& c) const;  // [kv_dim]
  at::Tensor Bv(const ModelConfig& c) const;  // [kv_dim]
  // W_q|W_k|W_v as float32 (dense: the tensor itself).
  at::Tensor Qkv() const;
};

struct ModelWeights {
  at::Tensor embed;       // [V, d]
  at::Tensor final_norm;  // [d]
  at::Tensor lm_head;     // [V, d]; shares storage with `embed` when embeddings are tied
  std::vector<LayerWeights> layers;
  // Packed (embed and lm_head undefined): the LM head, and the embedding table unless it is the
  // same matrix (tied embeddings: EmbeddingTable() is the LM head).
  PackedWeight packed_embed, packed_lm_head;
  const PackedWeight& EmbeddingTable() const {
    return packed_embed.empty() ? packed_lm_head : packed_embed;
  }
  bool packed() const { return !packed_lm_head.empty(); }

  // Loads and validates every tensor's presence and shape against `config`; a tied embedding may
  // be stored under either `model.embed_tokens.weight` or `lm_head.weight`.
  // `format` other than kDense: packed (dtype float32 on the CPU).
  static absl::StatusOr<ModelWeights> Load(const Checkpoint& checkpoint, const ModelConfig& config,
                                           c10::ScalarType dtype, c10::Device device,
                                           WeightFormat format = WeightFormat::kDense);
  // Seeded random weights (normal(0, 0.02), unit norms) for speed work on configs without weights.
  // The same numbers in every format (drawn in float32, then converted or packed).
  static ModelWeights Dummy(const ModelConfig& config, uint64_t seed, c10::ScalarType dtype,
                            c10::Device device, WeightFormat format = WeightFormat::kDense);
  // Packs the embedding and LM head (tied: once). REQUIRES: format is not kDense.
  void PackHead(const ModelConfig& config, WeightFormat format);
  // Moves the dense embedding and LM head onto 2 MiB pages (tied: once).
  void MoveHeadOntoHugePages(const ModelConfig& config);
};

}  // namespace scd

#endif  // SCD_MODEL_WEIGHTS_H_
