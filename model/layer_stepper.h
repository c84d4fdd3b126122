// LayerStepper: runs a few new tokens through a model one layer at a time, each layer as soon as
// that layer of the cache holds every position before them. A consumer rebuilding its cache layer
// by layer from transferred codes uses it for the prompt's last token: layer l's step needs only
// layers <= l, so by the time the last layer is rebuilt the token has been through all the
// others, and only the last layer and the LM head follow the transfer. The result equals
// LlamaModel::Forward of the same tokens on the finished cache, bit for bit (the same layer code
// on the same inputs), and leaves the cache holding the tokens' K/V in every layer.
//
// Thread-safety: none; one per sequence, calls serialized with whatever fills the cache.
#ifndef SCD_MODEL_LAYER_STEPPER_H_
#define SCD_MODEL_LAYER_STEPPER_H_

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "base/token_id.h"
#include "model/kv_cache.h"
#include "model/llama_model.h"

namespace scd {

class LayerStepper {
 public:
  // `tokens` (at least one) will sit at positions [position, position + tokens.size()).
  // REQUIRES: `model` outlives the stepper.
  static absl::StatusOr<LayerStepper> Start(const LlamaModel& model,
                                            absl::Span<const TokenId> tokens, int64_t position);

  // Runs the tokens through every layer, from the next one on, whose cache layer holds exactly
  // `position` positions (filled up to them), stopping at the first that does not. Returns the
  // layers run. An error (the cache's shape, positions beyond the model's) leaves the cache
  // partial: discard it.
  absl::StatusOr<int> Advance(KvCache* cache);

  int next_layer() const { return next_; }
  bool done() const;
  // Final RMSNorm + LM head of the last token: float32 [1, vocab].
  // FailedPrecondition until done().
  absl::StatusOr<at::Tensor> LastLogits() const;
  // Wall time spent in Advance's layer steps and LastLogits.
  absl::Duration compute_time() const { return compute_time_; }

 private:
  LayerStepper(const LlamaModel& model, at::Tensor hidden, int64_t position)
      : model_(&model), hidden_(std::move(hidden)), position_(position) {}

  const LlamaModel* model_;
  at::Tensor hidden_;  // [T, hidden] leaving layer next_ - 1 (the embeddings before layer 0)
  int64_t position_;
  int next_ = 0;
  mutable absl::Duration compute_time_;
};

}  // namespace scd

#endif  // SCD_MODEL_LAYER_STEPPER_H_
