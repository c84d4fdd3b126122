#include "codec/code_decoder.h"

#include <ATen/ATen.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "base/exception_guard.h"
#include "base/status_macros.h"

namespace scd {

// The batch's chunks sorted by layer, checked against the consumer and the batch's span.
absl::StatusOr<std::vector<CodeDecoder::LayerChunks>> CodeDecoder::GroupByLayer(
    const CodeBatch& batch, int layers) {
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
  for (int l = 0; l < layers; ++l) {
    if ((by_layer[l].key == nullptr) != (by_layer[l].value == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat("layer ", l, " has keys or values, not both"));
    }
  }
  return by_layer;
}

CodeDecoder::CodeDecoder(const LlamaModel& consumer, const Artifact* artifact)
    : consumer_(consumer), artifact_(artifact) {}

absl::Status CodeDecoder::NeedArtifact(int layer) const {
  if (artifact_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("layer ", layer, " carries codes but the decoder has no artifact"));
  }
  return absl::OkStatus();
}

absl::StatusOr<CodeDecoder::UnpackedLayer> CodeDecoder::Unpack(int l,
                                                               const LayerChunks& lc) const {
  return GuardExceptions("CodeDecoder::Unpack", [&]() -> absl::StatusOr<UnpackedLayer> {
    const c10::Device device = consumer_.device();
    UnpackedLayer out;
    out.layer = l;
    if ((lc.key == nullptr) != (lc.value == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat("layer ", l, " has keys or values, not both"));
    }
    if (lc.key != nullptr) {
      SCD_ASSIGN_OR_RETURN(out.key, UnpackTensor(*lc.key, device));
      SCD_ASSIGN_OR_RETURN(out.value, UnpackTensor(*lc.value, device));
      out.codes = lc.key->kind == PayloadKind::kKeyCode;
      if (out.codes) SCD_RETURN_IF_ERROR(NeedArtifact(l));
      if (out.key.dim() < 2 || out.value.dim() < 2 || out.key.size(-2) != out.value.size(-2)) {
        return absl::InvalidArgumentError(
            absl::StrCat("layer ", l, ": keys and values cover different positions"));
      }
      out.rows = out.key.size(-2);
      return out;
    }
    if (lc.hidden_code != nullptr) {
      SCD_RETURN_IF_ERROR(NeedArtifact(l));
      if (!artifact_->layers[l].patch) {
        return absl::FailedPreconditionError(absl::StrCat("layer ", l, " has no patch aligner"));
      }
      SCD_ASSIGN_OR_RETURN(out.hidden_code, UnpackTensor(*lc.hidden_code, device));
      if (out.hidden_code.dim() != 2) {
        return absl::InvalidArgumentError(absl::StrCat("layer ", l, ": a hidden code must be 2-d"));
      }
      out.rows = out.hidden_code.size(0);
    }
    return out;  // rows 0: recomputed
  });
}

absl::Status CodeDecoder::DecodeRows(const UnpackedLayer& u, int64_t begin, int64_t count,
                                     KvCache* cache) const {
  return GuardExceptions("CodeDecoder::DecodeRows", [&]() -> absl::Status {
    const int l = u.layer;
    if (begin < 0 || count <= 0 || begin + count > u.rows) {
      return absl::InvalidArgumentError(absl::StrCat("layer ", l, ": rows [", begin, ", ",
                                                     begin + count, ") of ", u.rows));
    }
    const c10::Device device = consumer_.device();
    const bool whole = begin == 0 && count == u.rows;
    if (u.key.defined()) {
      at::Tensor k = whole ? u.key : u.key.narrow(-2, begin, count);
      at::Tensor v = whole ? u.value : u.value.narrow(-2, begin, count);
      if (u.codes) {
        k = artifact_->layers[l].key.To(device).Decode(k);  // [kv_heads, T, head_dim]
        v = artifact_->layers[l].value.To(device).Decode(v);
      }
      return consumer_.LoadPrefix(l, k, v, KeyFormat::kPreRope, cache);
    }
    at::Tensor code = whole ? u.hidden_code : u.hidden_code.narrow(0, begin, count);
    at::Tensor h = artifact_->layers[l].patch->To(device).Align(code);
    auto [k, v] = consumer_.ProjectKeyValue(l, h);  // the consumer's own W_k, W_v
    return consumer_.LoadPrefix(l, k, v, KeyFormat::kPreRope, cache);
  });
}

absl::StatusOr<bool> CodeDecoder::DecodeLayer(int l, const LayerChunks& lc, KvCache* cache) const {
  SCD_ASSIGN_OR_RETURN(UnpackedLayer unpacked, Unpack(l, lc));
  if (unpacked.rows == 0) return false;  // recomputed
  SCD_RETURN_IF_ERROR(DecodeRows(unpacked, 0, unpacked.rows, cache));
  return true;
}

absl::Status CodeDecoder::Recompute(const std::vector<LayerChunks>& by_layer,
                                    const std::vector<bool>& filled,
                                    absl::Span<const TokenId> tokens, KvCache* cache) const {
  // What is left is recomputed, in maximal runs of layers.
  const int layers = static_cast<int>(filled.size());
  for (int begin = 0; begin < layers;) {
    if (filled[begin]) {
      ++begin;
      continue;
    }
    int end = begin;
    while (end < layers && !filled[end]) ++end;
    SCD_RETURN_IF_ERROR(RecomputeSegment(begin, end, by_layer[begin].hidden_state, tokens, cache));
    begin = end;
  }
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> CodeDecoder::SegmentInput(int begin, const CodeChunk* hidden_state,
                                                      absl::Span<const TokenId> tokens) const {
  return GuardExceptions("CodeDecoder::SegmentInput", [&]() -> absl::StatusOr<at::Tensor> {
    if (begin == 0) return consumer_.Embed(tokens);
    if (hidden_state != nullptr) return UnpackTensor(*hidden_state, consumer_.device());
    return absl::InvalidArgumentError(absl::StrCat(
        "layers from ", begin, " on have no payload and no hidden state to recompute from"));
  });
}

absl::Status CodeDecoder::RecomputeRows(int begin, int end, const at::Tensor& input,
                                        int64_t row_begin, int64_t count, KvCache* cache) const {
  return GuardExceptions("CodeDecoder::RecomputeRows", [&]() -> absl::Status {
    if (input.dim() != 2 || row_begin < 0 || count <= 0 || row_begin + count > input.size(0)) {
      return absl::InvalidArgumentError(absl::StrCat("recompute rows [", row_begin, ", ",
                                                     row_begin + count, ") of an input of ",
                                                     input.dim() == 2 ? input.size(0) : -1));
    }
    const bool whole = row_begin == 0 && count == input.size(0);
    return consumer_.RunLayers(begin, end, whole ? input : input.narrow(0, row_begin, count), cache)
        .status();
  });
}

absl::Status CodeDecoder::RecomputeSegment(int begin, int end, const CodeChunk* hidden_state,
                                           absl::Span<const TokenId> tokens, KvCache* cache) const {
  SCD_ASSIGN_OR_RETURN(at::Tensor input, SegmentInput(begin, hidden_state, tokens));
  return RecomputeRows(begin, end, input, 0, input.size(0), cache);
}

absl::Status CodeDecoder::Decode(const CodeBatch& batch, absl::Span<const TokenId> tokens,
                                 KvCache* cache) const {
  return GuardExceptions("CodeDecoder::Decode", [&]() -> absl::Status {
    const int layers = static_cast<int>(consumer_.config().num_layers);
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
    SCD_ASSIGN_OR_RETURN(std::vector<LayerChunks> by_layer, GroupByLayer(batch, layers));
    std::vector<bool> filled(layers, false);
    for (int l = 0; l < layers; ++l) {
      SCD_ASSIGN_OR_RETURN(bool done, DecodeLayer(l, by_layer[l], cache));
      filled[l] = done;
    }
    return Recompute(by_layer, filled, tokens, cache);
  });
}

}  // namespace scd
