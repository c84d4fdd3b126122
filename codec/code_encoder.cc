#include "codec/code_encoder.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "base/exception_guard.h"
#include "base/status_macros.h"

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
      switch (plan_.layers[l]) {
        case LayerPayload::kNone:
        case LayerPayload::kRecompute:
          break;
        case LayerPayload::kRaw:
        case LayerPayload::kInt4: {
          SCD_ASSIGN_OR_RETURN(const LayerCapture* c, capture(l));
          const WireDtype dtype =
              plan_.layers[l] == LayerPayload::kInt4 ? WireDtype::kInt4 : options_.raw_dtype;
          batch.chunks.push_back(Chunk(c->key_prerope, dtype, l, PayloadKind::kRawKey, tokens));
          batch.chunks.push_back(Chunk(c->value, dtype, l, PayloadKind::kRawValue, tokens));
          break;
        }
        case LayerPayload::kCodes: {
          SCD_ASSIGN_OR_RETURN(const LayerCapture* c, capture(l));
          const ArtifactLayer& a = artifact_->layers[l];
          at::Tensor zk = a.key.Encode(c->key_prerope, plan_.rank_k[l]);  // [kv_heads, T, r_K]
          at::Tensor zv = a.value.Encode(c->value, plan_.rank_v[l]);      // [kv_heads, T, r_V]
          batch.chunks.push_back(Chunk(zk, options_.code_dtype, l, PayloadKind::kKeyCode, tokens));
          batch.chunks.push_back(
              Chunk(zv, options_.code_dtype, l, PayloadKind::kValueCode, tokens));
          break;
        }
        case LayerPayload::kPatch: {
          SCD_ASSIGN_OR_RETURN(const LayerCapture* c, capture(l));
          at::Tensor zh = artifact_->layers[l].patch->Encode(c->attn_input, plan_.rank_h[l]);
          batch.chunks.push_back(
              Chunk(zh, options_.code_dtype, l, PayloadKind::kHiddenCode, tokens));
          break;
        }
      }
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
