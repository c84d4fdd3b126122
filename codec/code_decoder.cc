#include "codec/code_decoder.h"

#include <ATen/ATen.h>

#include <map>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace scd {
namespace {

struct LayerChunks {
  const CodeChunk* key = nullptr;    // raw key or key code
  const CodeChunk* value = nullptr;  // raw value or value code
  const CodeChunk* hidden_code = nullptr;
  const CodeChunk* hidden_state = nullptr;
};

}  // namespace

CodeDecoder::CodeDecoder(const LlamaModel& consumer, const Artifact* artifact)
    : consumer_(consumer), artifact_(artifact) {}

absl::Status CodeDecoder::Decode(const CodeBatch& batch, absl::Span<const TokenId> tokens,
                                 KvCache* cache) const {
  const int layers = static_cast<int>(consumer_.config().num_layers);
  const c10::Device device = consumer_.device();
  for (int l = 0; l < layers; ++l) {
    if (cache->length(l) != 0) {
      return absl::FailedPreconditionError("CodeDecoder::Decode needs an empty cache");
    }
  }
  if (static_cast<int64_t>(tokens.size()) != batch.tokens) {
    return absl::InvalidArgumentError(absl::StrCat("the batch covers ", batch.tokens,
                                                   " positions but ", tokens.size(),
                                                   " prefix tokens were given"));
  }
  std::vector<LayerChunks> by_layer(layers);
  for (const CodeChunk& c : batch.chunks) {
    if (c.layer < 0 || c.layer >= layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk for layer ", c.layer, " but the consumer has ", layers));
    }
    if (c.token_begin != 0 || c.token_end != batch.tokens) {
      return absl::UnimplementedError("partial token ranges are not supported yet");
    }
    LayerChunks& lc = by_layer[c.layer];
    switch (c.kind) {
      case PayloadKind::kRawKey:
      case PayloadKind::kKeyCode:
        lc.key = &c;
        break;
      case PayloadKind::kRawValue:
      case PayloadKind::kValueCode:
        lc.value = &c;
        break;
      case PayloadKind::kHiddenCode:
        lc.hidden_code = &c;
        break;
      case PayloadKind::kHiddenState:
        lc.hidden_state = &c;
        break;
    }
  }
  auto need_artifact = [&](int l) -> absl::Status {
    if (artifact_ == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("layer ", l, " carries codes but the decoder has no artifact"));
    }
    return absl::OkStatus();
  };
  std::vector<bool> filled(layers, false);
  for (int l = 0; l < layers; ++l) {
    const LayerChunks& lc = by_layer[l];
    if ((lc.key == nullptr) != (lc.value == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat("layer ", l, " has keys or values, not both"));
    }
    if (lc.key != nullptr) {
      at::Tensor k = UnpackTensor(*lc.key, device), v = UnpackTensor(*lc.value, device);
      if (lc.key->kind == PayloadKind::kKeyCode) {
        SCD_RETURN_IF_ERROR(need_artifact(l));
        k = artifact_->layers[l].key.To(device).Decode(k);  // [kv_heads, T, head_dim]
        v = artifact_->layers[l].value.To(device).Decode(v);
      }
      SCD_RETURN_IF_ERROR(consumer_.LoadPrefix(l, k, v, KeyFormat::kPreRope, cache));
      filled[l] = true;
    } else if (lc.hidden_code != nullptr) {
      SCD_RETURN_IF_ERROR(need_artifact(l));
      if (!artifact_->layers[l].patch) {
        return absl::FailedPreconditionError(absl::StrCat("layer ", l, " has no patch aligner"));
      }
      at::Tensor h =
          artifact_->layers[l].patch->To(device).Align(UnpackTensor(*lc.hidden_code, device));
      auto [k, v] = consumer_.ProjectKeyValue(l, h);  // the consumer's own W_k, W_v
      SCD_RETURN_IF_ERROR(consumer_.LoadPrefix(l, k, v, KeyFormat::kPreRope, cache));
      filled[l] = true;
    }
  }
  // What is left is recomputed, in maximal runs of layers.
  for (int begin = 0; begin < layers;) {
    if (filled[begin]) {
      ++begin;
      continue;
    }
    int end = begin;
    while (end < layers && !filled[end]) ++end;
    at::Tensor hidden;
    if (begin == 0) {
      SCD_ASSIGN_OR_RETURN(hidden, consumer_.Embed(tokens));
    } else if (by_layer[begin].hidden_state != nullptr) {
      hidden = UnpackTensor(*by_layer[begin].hidden_state, device);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "layers [", begin, ", ", end, ") have no payload and no hidden state to recompute from"));
    }
    SCD_RETURN_IF_ERROR(consumer_.RunLayers(begin, end, hidden, cache).status());
    begin = end;
  }
  return absl::OkStatus();
}

}  // namespace scd
