#include "codec/transfer_plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace scd {

absl::StatusOr<TransferPlan> TransferPlan::Make(TransferMode mode, const ModelConfig& producer,
                                                const Artifact* artifact,
                                                const TransferOptions& options) {
  const int layers = static_cast<int>(producer.num_layers);
  if (ModeNeedsArtifact(mode) && artifact == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("mode ", TransferModeName(mode), " needs a calibration artifact"));
  }
  if (artifact != nullptr && static_cast<int>(artifact->layers.size()) != layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("artifact has ", artifact->layers.size(), " layers, the producer ", layers));
  }
  TransferPlan plan;
  plan.mode = mode;
  plan.layers.assign(layers, LayerPayload::kNone);
  plan.rank_k.assign(layers, 0);
  plan.rank_v.assign(layers, 0);
  plan.rank_h.assign(layers, 0);
  auto pick = [](int64_t requested, int64_t available) {
    return requested > 0 ? std::min(requested, available) : available;
  };
  for (int l = 0; l < layers; ++l) {
    switch (mode) {
      case TransferMode::kLocal:
        break;
      case TransferMode::kRaw:
        plan.layers[l] = LayerPayload::kRaw;
        break;
      case TransferMode::kInt4:
        plan.layers[l] = LayerPayload::kInt4;
        break;
      case TransferMode::kRecompute:
        plan.layers[l] = LayerPayload::kRaw;
        break;
      case TransferMode::kReuse:
        plan.layers[l] = LayerPayload::kCodes;
        break;
      case TransferMode::kScd:
        plan.layers[l] = artifact->layers[l].route == LayerRoute::kPatch ? LayerPayload::kPatch
                                                                         : LayerPayload::kCodes;
        break;
    }
    if (plan.layers[l] == LayerPayload::kCodes) {
      plan.rank_k[l] = pick(options.rank_k, artifact->layers[l].key.rank());
      plan.rank_v[l] = pick(options.rank_v, artifact->layers[l].value.rank());
    } else if (plan.layers[l] == LayerPayload::kPatch) {
      plan.rank_h[l] = pick(options.rank_h, artifact->layers[l].patch->rank());
    }
  }
  if (mode == TransferMode::kRecompute) {
    std::vector<int> recompute = options.recompute_layers;
    if (recompute.empty() && artifact != nullptr) recompute = artifact->RecomputeLayers();
    if (recompute.empty()) {
      return absl::FailedPreconditionError(
          "recompute mode needs the layers to recompute (from the artifact or explicitly)");
    }
    for (int l : recompute) {
      if (l < 0 || l >= layers) {
        return absl::InvalidArgumentError(absl::StrCat("recompute layer ", l, " out of range"));
      }
      plan.layers[l] = LayerPayload::kRecompute;
    }
    for (int l = 0; l < layers;) {
      if (plan.layers[l] != LayerPayload::kRecompute) {
        ++l;
        continue;
      }
      int end = l;
      while (end < layers && plan.layers[end] == LayerPayload::kRecompute) ++end;
      plan.segments.emplace_back(l, end);
      l = end;
    }
  }
  // The producer captures exactly what this plan sends.
  for (int l = 0; l < layers; ++l) {
    switch (plan.layers[l]) {
      case LayerPayload::kNone:
        break;
      case LayerPayload::kRaw:
      case LayerPayload::kInt4:
      case LayerPayload::kCodes:
        plan.capture.layers.push_back(l);
        plan.capture.key_prerope = plan.capture.value = true;
        break;
      case LayerPayload::kPatch:
        plan.capture.layers.push_back(l);
        plan.capture.attn_input = true;
        break;
      case LayerPayload::kRecompute:
        break;
    }
  }
  for (const auto& [begin, end] : plan.segments) {
    if (begin > 0) {
      plan.capture.layers.push_back(begin);
      plan.capture.residual = true;
    }
  }
  std::sort(plan.capture.layers.begin(), plan.capture.layers.end());
  return plan;
}

}  // namespace scd
