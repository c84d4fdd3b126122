// CodeDecoder: the consumer side of a transfer. It rebuilds the consumer's own native KV cache
// for a prefix from a CodeBatch: raw/int4 K/V are rotated with the consumer's RoPE, reuse codes
// are decoded by the translators, patch codes go through the aligners and the consumer's own
// W_k/W_v, recomputed segments run the consumer's layers.
// Thread-safety: immutable after construction; Decode may run concurrently on distinct caches.
#ifndef SCD_CODEC_CODE_DECODER_H_
#define SCD_CODEC_CODE_DECODER_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "codec/artifact.h"
#include "codec/code_batch.h"
#include "codec/transfer_plan.h"
#include "model/llama_model.h"

namespace scd {

class CodeDecoder {
 public:
  // The chunks of one layer (not owned); null where absent.
  struct LayerChunks {
    const CodeChunk* key = nullptr;    // raw key or key code
    const CodeChunk* value = nullptr;  // raw value or value code
    const CodeChunk* hidden_code = nullptr;
    const CodeChunk* hidden_state = nullptr;  // residual entering a recomputed segment
  };

  // REQUIRES: `artifact` (may be null for modes without one) outlives the decoder and was
  // fitted for `consumer`.
  CodeDecoder(const LlamaModel& consumer, const Artifact* artifact);

  // Fills every layer of the empty `cache` with the batch's prefix positions. `tokens` are the
  // prefix ids (local mode and a recomputed segment starting at layer 0 embed them).
  absl::Status Decode(const CodeBatch& batch, absl::Span<const TokenId> tokens,
                      KvCache* cache) const;

  // The steps of Decode, for rebuilding layer by layer as chunks arrive (LayerwiseRebuilder).
  // Fills `layer` from its K/V or hidden code; false (nothing done) when it has neither, i.e. the
  // layer is left for recomputation.
  absl::StatusOr<bool> DecodeLayer(int layer, const LayerChunks& chunks, KvCache* cache) const;
  // Runs the consumer's layers [begin, end) from the prefix's embeddings (begin == 0, `tokens`)
  // or from the producer's residual stream entering `begin` (`hidden_state`).
  absl::Status RecomputeSegment(int begin, int end, const CodeChunk* hidden_state,
                                absl::Span<const TokenId> tokens, KvCache* cache) const;

  // The same two steps in pieces of positions, so a scheduler can interleave them with decode
  // steps (LayerwiseRebuilder's pacing). The positions of a transfer are the rows along each
  // payload tensor's second-to-last dimension; pieces must come in order, each continuing where
  // the cache layer ends. Every position's result depends on its own row only (and, when
  // recomputing, on the positions before it, already in the cache), so the pieces fill the cache
  // with the values DecodeLayer and RecomputeSegment give, up to the order of the sums inside
  // matrix products of other row counts.
  struct UnpackedLayer {
    int layer = 0;
    int64_t rows = 0;       // 0: the layer has no payload (left for recomputation)
    bool codes = false;     // key/value are codes for the artifact's translators
    at::Tensor key, value;  // raw K/V [kv_heads, T, head_dim] or their codes [.., T, r]
    at::Tensor hidden_code;  // [T, r]
  };
  absl::StatusOr<UnpackedLayer> Unpack(int layer, const LayerChunks& chunks) const;
  absl::Status DecodeRows(const UnpackedLayer& unpacked, int64_t begin, int64_t count,
                          KvCache* cache) const;
  // The input of a recomputed segment [begin, ..): the embeddings of `tokens` (begin == 0) or the
  // producer's residual stream entering `begin`, [T, hidden].
  absl::StatusOr<at::Tensor> SegmentInput(int begin, const CodeChunk* hidden_state,
                                          absl::Span<const TokenId> tokens) const;
  // Runs rows [row_begin, row_begin + count) of `input` through layers [begin, end).
  absl::Status RecomputeRows(int begin, int end, const at::Tensor& input, int64_t row_begin,
                             int64_t count, KvCache* cache) const;

 private:
  static absl::StatusOr<std::vector<LayerChunks>> GroupByLayer(const CodeBatch& batch, int layers);
  absl::Status NeedArtifact(int layer) const;
  absl::Status Recompute(const std::vector<LayerChunks>& by_layer, const std::vector<bool>& filled,
                         absl::Span<const TokenId> tokens, KvCache* cache) const;

  const LlamaModel& consumer_;
  const Artifact* artifact_;
};

}  // namespace scd

#endif  // SCD_CODEC_CODE_DECODER_H_
