#include "codec/transfer_plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "model/status_macros.h"

namespace scd {

std::string TransferModeName(TransferMode mode) {
  switch (mode) {
    case TransferMode::kLocal:
      return "local";
    case TransferMode::kRaw:
      return "raw";
    case TransferMode::kInt4:
      return "int4";
    case TransferMode::kRecompute:
      return "recompute";
    case TransferMode::kReuse:
      return "reuse";
    case TransferMode::kScd:
      return "scd";
  }
  return "?";
}

absl::StatusOr<TransferMode> ParseTransferMode(const std::string& name) {
  for (TransferMode m : {TransferMode::kLocal, TransferMode::kRaw, TransferMode::kInt4,
                         TransferMode::kRecompute, TransferMode::kReuse, TransferMode::kScd}) {
    if (TransferModeName(m) == name) return m;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "transfer mode '", name, "' is not one of local, raw, int4, recompute, reuse, scd"));
}

absl::StatusOr<std::vector<TransferMode>> ParseTransferModes(const std::string& list) {
  std::vector<TransferMode> modes;
  for (absl::string_view part : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    SCD_ASSIGN_OR_RETURN(TransferMode m,
                         ParseTransferMode(std::string(absl::StripAsciiWhitespace(part))));
    if (std::find(modes.begin(), modes.end(), m) == modes.end()) modes.push_back(m);
  }
  if (modes.empty()) return absl::InvalidArgumentError("no transfer modes given");
  return modes;
}

bool ModeNeedsArtifact(TransferMode mode) {
  return mode == TransferMode::kReuse || mode == TransferMode::kScd;
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
