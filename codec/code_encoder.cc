#include "codec/code_encoder.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/exception_guard.h"
#include "base/status_macros.h"
#include "model/compute_steps.h"

namespace scd {
namespace {

CodeChunk Chunk(const at::Tensor& values, WireDtype dtype, int layer, PayloadKind kind,
                int64_t tokens) {
  CodeChunk chunk = PackTensor(values, dtype);
  chunk.layer = layer;
  chunk.kind = kind;
  chunk.token_begin = 0;
  chunk.token_end = tokens;
  return chunk;
}

}  // namespace

CodeEncoder::CodeEncoder(TransferPlan plan, const Artifact* artifact, TransferOptions options)
    : plan_(std::move(plan)), artifact_(artifact), options_(std::move(options)) {}

absl::StatusOr<CodeBatch> CodeEncoder::Encode(const Captures& captures, int64_t tokens) const {
  return GuardExceptions("CodeEncoder::Encode", [&]() -> absl::StatusOr<CodeBatch> {
    CodeBatch batch;
    batch.mode = plan_.mode;
    batch.tokens = tokens;
    auto capture = [&](int layer) -> absl::StatusOr<const LayerCapture*> {
      auto it = captures.find(layer);
      if (it == captures.end()) {
        return absl::FailedPreconditionError(absl::StrCat("layer ", layer, " was not captured"));
      }
      return &it->second;
    };
    for (int l = 0; l < static_cast<int>(plan_.layers.size()); ++l) {
      const LayerPayload payload = plan_.layers[l];
      if (payload == LayerPayload::kNone || payload == LayerPayload::kRecompute) continue;
      SCD_ASSIGN_OR_RETURN(const LayerCapture* c, capture(l));
      SCD_RETURN_IF_ERROR(AppendLayerPayload(l, *c, tokens, &batch.chunks));
    }
    for (const auto& [begin, end] : plan_.segments) {
      if (begin == 0) continue;  // the consumer embeds the tokens itself
      SCD_ASSIGN_OR_RETURN(const LayerCapture* c, capture(begin));
      batch.chunks.push_back(
          Chunk(c->residual, options_.raw_dtype, begin, PayloadKind::kHiddenState, tokens));
    }
    return batch;
  });
}

absl::StatusOr<std::vector<CodeChunk>> CodeEncoder::EncodeLayer(int layer,
                                                                const LayerCapture& capture,
                                                                int64_t tokens) const {
  return GuardExceptions(
      "CodeEncoder::EncodeLayer", [&]() -> absl::StatusOr<std::vector<CodeChunk>> {
        ComputeStep step;  // model work beside other requests' steps (model/compute_steps.h)
        if (layer < 0 || layer >= static_cast<int>(plan_.layers.size())) {
          return absl::InvalidArgumentError(absl::StrCat("layer ", layer, " is not in the plan's ",
                                                         plan_.layers.size(), " layers"));
        }
        std::vector<CodeChunk> chunks;
        SCD_RETURN_IF_ERROR(AppendLayerPayload(layer, capture, tokens, &chunks));
        if (StartsRecomputedSegment(layer)) {
          if (!capture.residual.defined()) {
            return absl::FailedPreconditionError(absl::StrCat(
                "layer ", layer, " starts a recomputed segment: residual not captured"));
          }
          chunks.push_back(Chunk(capture.residual, options_.raw_dtype, layer,
                                 PayloadKind::kHiddenState, tokens));
        }
        return chunks;
      });
}

int64_t TotalBytes(const std::vector<PlannedChunk>& chunks) {
  int64_t bytes = 0;
  for (const PlannedChunk& chunk : chunks) bytes += chunk.bytes;
  return bytes;
}

std::vector<PlannedChunk> ChunksFromLayer(const std::vector<PlannedChunk>& chunks,
                                          int layer_begin) {
  std::vector<PlannedChunk> from;
  for (const PlannedChunk& chunk : chunks) {
    if (chunk.layer >= layer_begin) from.push_back(chunk);
  }
  return from;
}

absl::StatusOr<std::vector<PlannedChunk>> CodeEncoder::PlannedChunks(const ModelConfig& producer,
                                                                     int64_t tokens) const {
  const int layers = static_cast<int>(plan_.layers.size());
  if (producer.num_layers != layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("the plan has ", layers, " layers, the model ", producer.num_layers));
  }
  std::vector<PlannedChunk> chunks;
  auto add = [&](int layer, PayloadKind kind, WireDtype dtype,
                 std::vector<int64_t> shape) -> absl::Status {
    SCD_ASSIGN_OR_RETURN(ChunkByteCounts counts, ExpectedChunkBytes(dtype, shape));
    chunks.push_back({layer, kind, dtype, std::move(shape), counts.data + counts.scales});
    return absl::OkStatus();
  };
  const int64_t heads = producer.num_kv_heads, head_dim = producer.head_dim;
  for (int l = 0; l < layers; ++l) {
    switch (plan_.layers[l]) {
      case LayerPayload::kNone:
      case LayerPayload::kRecompute:
        break;
      case LayerPayload::kRaw:
      case LayerPayload::kInt4: {
        const WireDtype dtype =
            plan_.layers[l] == LayerPayload::kInt4 ? WireDtype::kInt4 : options_.raw_dtype;
        SCD_RETURN_IF_ERROR(add(l, PayloadKind::kRawKey, dtype, {heads, tokens, head_dim}));
        SCD_RETURN_IF_ERROR(add(l, PayloadKind::kRawValue, dtype, {heads, tokens, head_dim}));
        break;
      }
      case LayerPayload::kCodes: {
        const ArtifactLayer& a = artifact_->layers[l];  // a folded map: one row per token
        SCD_RETURN_IF_ERROR(add(l, PayloadKind::kKeyCode, options_.code_dtype,
                                {a.key.CodeRows(heads), tokens, plan_.rank_k[l]}));
        SCD_RETURN_IF_ERROR(add(l, PayloadKind::kValueCode, options_.code_dtype,
                                {a.value.CodeRows(heads), tokens, plan_.rank_v[l]}));
        break;
      }
      case LayerPayload::kPatch:
        SCD_RETURN_IF_ERROR(
            add(l, PayloadKind::kHiddenCode, options_.code_dtype, {tokens, plan_.rank_h[l]}));
        break;
    }
    if (StartsRecomputedSegment(l)) {
      SCD_RETURN_IF_ERROR(
          add(l, PayloadKind::kHiddenState, options_.raw_dtype, {tokens, producer.hidden_size}));
    }
  }
  return chunks;
}

bool CodeEncoder::StartsRecomputedSegment(int layer) const {
  return layer != 0 && std::any_of(plan_.segments.begin(), plan_.segments.end(),
                                   [&](const auto& segment) { return segment.first == layer; });
}

absl::Status CodeEncoder::AppendLayerPayload(int l, const LayerCapture& c, int64_t tokens,
                                             std::vector<CodeChunk>* chunks) const {
  auto need = [&](const at::Tensor& t, const char* what) -> absl::Status {
    if (t.defined()) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat("layer ", l, ": ", what, " not captured"));
  };
  switch (plan_.layers[l]) {
    case LayerPayload::kNone:
    case LayerPayload::kRecompute:
      break;
    case LayerPayload::kRaw:
    case LayerPayload::kInt4: {
      SCD_RETURN_IF_ERROR(need(c.key_prerope, "keys"));
      SCD_RETURN_IF_ERROR(need(c.value, "values"));
      const WireDtype dtype =
          plan_.layers[l] == LayerPayload::kInt4 ? WireDtype::kInt4 : options_.raw_dtype;
      chunks->push_back(Chunk(c.key_prerope, dtype, l, PayloadKind::kRawKey, tokens));
      chunks->push_back(Chunk(c.value, dtype, l, PayloadKind::kRawValue, tokens));
      break;
    }
    case LayerPayload::kCodes: {
      SCD_RETURN_IF_ERROR(need(c.key_prerope, "keys"));
      SCD_RETURN_IF_ERROR(need(c.value, "values"));
      const ArtifactLayer& a = artifact_->layers[l];
      at::Tensor zk = a.key.Encode(c.key_prerope, plan_.rank_k[l]);  // [rows, T, r_K]
      at::Tensor zv = a.value.Encode(c.value, plan_.rank_v[l]);      // [rows, T, r_V]
      chunks->push_back(Chunk(zk, options_.code_dtype, l, PayloadKind::kKeyCode, tokens));
      chunks->push_back(Chunk(zv, options_.code_dtype, l, PayloadKind::kValueCode, tokens));
      break;
    }
    case LayerPayload::kPatch: {
      SCD_RETURN_IF_ERROR(need(c.attn_input, "attention input"));
      at::Tensor zh = artifact_->layers[l].patch->Encode(c.attn_input, plan_.rank_h[l]);
      chunks->push_back(Chunk(zh, options_.code_dtype, l, PayloadKind::kHiddenCode, tokens));
      break;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<CodeBatch> CodeEncoder::Prefill(const LlamaModel& producer,
                                               absl::Span<const TokenId> tokens) const {
  return GuardExceptions("CodeEncoder::Prefill", [&]() -> absl::StatusOr<CodeBatch> {
    KvCache cache = producer.NewCache(static_cast<int64_t>(tokens.size()));
    SCD_ASSIGN_OR_RETURN(
        ForwardOutput out,
        producer.Forward(tokens, &cache, {.logits = LogitsMode::kNone, .capture = &plan_.capture}));
    return Encode(out.captures, static_cast<int64_t>(tokens.size()));
  });
}

}  // namespace scd
