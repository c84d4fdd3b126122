#include "model/layer_stepper.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/exception_guard.h"
#include "base/status_macros.h"
#include "model/compute_steps.h"

namespace scd {

absl::StatusOr<LayerStepper> LayerStepper::Start(const LlamaModel& model,
                                                 absl::Span<const TokenId> tokens,
                                                 int64_t position) {
  if (tokens.empty()) return absl::InvalidArgumentError("LayerStepper needs at least one token");
  if (position < 0 || position + static_cast<int64_t>(tokens.size()) >
                          model.config().max_position_embeddings) {
    return absl::OutOfRangeError(absl::StrCat(
        "tokens at positions [", position, ", ", position + static_cast<int64_t>(tokens.size()),
        ") exceed max_position_embeddings (", model.config().max_position_embeddings, ")"));
  }
  SCD_ASSIGN_OR_RETURN(at::Tensor hidden, model.Embed(tokens));
  return LayerStepper(model, std::move(hidden), position);
}

bool LayerStepper::done() const { return next_ >= model_->config().num_layers; }

absl::StatusOr<int> LayerStepper::Advance(KvCache* cache) {
  const int layers = static_cast<int>(model_->config().num_layers);
  if (cache->num_layers() != layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("the cache has ", cache->num_layers(), " layers, the model ", layers));
  }
  int ran = 0;
  while (next_ < layers && cache->length(next_) == position_) {
    const absl::Time start = absl::Now();
    SCD_ASSIGN_OR_RETURN(hidden_, model_->RunLayers(next_, next_ + 1, hidden_, cache));
    compute_time_ += absl::Now() - start;
    ++next_;
    ++ran;
  }
  return ran;
}

absl::StatusOr<at::Tensor> LayerStepper::LastLogits() const {
  if (!done()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the tokens have been through ", next_, " of ",
                     model_->config().num_layers, " layers"));
  }
  return GuardExceptions("LayerStepper::LastLogits", [&]() -> absl::StatusOr<at::Tensor> {
    ComputeStep step;
    const absl::Time start = absl::Now();
    at::Tensor logits = model_->Logits(hidden_.narrow(0, hidden_.size(0) - 1, 1));
    compute_time_ += absl::Now() - start;
    return logits;
  });
}

}  // namespace scd
