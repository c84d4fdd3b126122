#include "codec/transfer_plan.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace scd {

namespace {

LayerPayload PayloadFor(TransferMode mode, const ArtifactLayer* layer) {
  switch (mode) {
    case TransferMode::kLocal:
      return LayerPayload::kNone;
    case TransferMode::kRaw:
    case TransferMode::kRecompute:  // recomputed layers are marked afterwards
      return LayerPayload::kRaw;
    case TransferMode::kInt4:
      return LayerPayload::kInt4;
    case TransferMode::kReuse:
      return LayerPayload::kCodes;
    case TransferMode::kScd:
      return layer->route == LayerRoute::kPatch ? LayerPayload::kPatch : LayerPayload::kCodes;
  }
  return LayerPayload::kNone;
}

// Marks the recomputed layers and groups them into maximal runs.
absl::Status PlanRecompute(const Artifact* artifact, const TransferOptions& options,
                           TransferPlan* plan) {
  const int layers = static_cast<int>(plan->layers.size());
  std::vector<int> recompute = options.recompute_layers;
  if (recompute.empty() && artifact != nullptr) recompute = artifact->recompute_layers;
  if (recompute.empty()) {
    return absl::FailedPreconditionError(
        "recompute mode needs the layers to recompute (from the artifact or explicitly)");
  }
  for (int l : recompute) {
    if (l < 0 || l >= layers) {
      return absl::InvalidArgumentError(absl::StrCat("recompute layer ", l, " out of range"));
    }
    plan->layers[l] = LayerPayload::kRecompute;
  }
  for (int l = 0; l < layers;) {
    if (plan->layers[l] != LayerPayload::kRecompute) {
      ++l;
      continue;
    }
    int end = l;
    while (end < layers && plan->layers[end] == LayerPayload::kRecompute) ++end;
    plan->segments.emplace_back(l, end);
    l = end;
  }
  return absl::OkStatus();
}

// The producer captures exactly what the plan sends.
CaptureSpec CaptureFor(const TransferPlan& plan) {
  CaptureSpec capture;
  for (int l = 0; l < static_cast<int>(plan.layers.size()); ++l) {
    const LayerPayload p = plan.layers[l];
    if (p == LayerPayload::kRaw || p == LayerPayload::kInt4 || p == LayerPayload::kCodes) {
      capture.layers.push_back(l);
      capture.key_prerope = capture.value = true;
    } else if (p == LayerPayload::kPatch) {
      capture.layers.push_back(l);
      capture.attn_input = true;
    }
  }
  for (const auto& [begin, end] : plan.segments) {
    if (begin > 0) {
      capture.layers.push_back(begin);
      capture.residual = true;
    }
  }
  std::sort(capture.layers.begin(), capture.layers.end());
  return capture;
}

}  // namespace

TransferOptions TransferOptions::AtPoint(const FrontierPoint& point) {
  return AtPoint(point, TransferOptions());
}

TransferOptions TransferOptions::AtPoint(const FrontierPoint& point, TransferOptions base) {
  TransferOptions options = std::move(base);
  options.code_dtype = point.code_dtype;
  options.layer_rank_k = point.rank_k;
  options.layer_rank_v = point.rank_v;
  options.layer_rank_h = point.rank_h;
  return options;
}

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
  for (const auto* v : {&options.layer_rank_k, &options.layer_rank_v, &options.layer_rank_h}) {
    if (!v->empty() && static_cast<int>(v->size()) != layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("per-layer ranks for ", v->size(), " layers, the producer has ", layers));
    }
    if (std::any_of(v->begin(), v->end(), [](int64_t r) { return r < 0; })) {
      return absl::InvalidArgumentError("per-layer ranks must not be negative");
    }
  }
  // The rank asked for layer l: its per-layer entry when there is one, else the scalar.
  auto asked = [](const std::vector<int64_t>& per_layer, int64_t scalar, int l) {
    return per_layer.empty() ? scalar : per_layer[l];
  };
  TransferPlan plan;
  plan.mode = mode;
  plan.rank_k.assign(layers, 0);
  plan.rank_v.assign(layers, 0);
  plan.rank_h.assign(layers, 0);
  auto pick = [](int64_t requested, int64_t available) {
    return requested > 0 ? std::min(requested, available) : available;
  };
  for (int l = 0; l < layers; ++l) {
    const ArtifactLayer* a = artifact != nullptr ? &artifact->layers[l] : nullptr;
    plan.layers.push_back(PayloadFor(mode, a));
    if (plan.layers[l] == LayerPayload::kCodes) {
      plan.rank_k[l] = pick(asked(options.layer_rank_k, options.rank_k, l), a->key.rank());
      plan.rank_v[l] = pick(asked(options.layer_rank_v, options.rank_v, l), a->value.rank());
    } else if (plan.layers[l] == LayerPayload::kPatch) {
      plan.rank_h[l] = pick(asked(options.layer_rank_h, options.rank_h, l), a->patch->rank());
    }
  }
  if (mode == TransferMode::kRecompute)
    SCD_RETURN_IF_ERROR(PlanRecompute(artifact, options, &plan));
  plan.capture = CaptureFor(plan);
  return plan;
}

}  // namespace scd
