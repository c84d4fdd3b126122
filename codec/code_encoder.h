// CodeEncoder: the producer side of a transfer. Given the activations its prefill captured (the
// plan's CaptureSpec), it builds the CodeBatch the plan calls for: raw or int4 K/V, reuse codes,
// hidden-state codes for patch layers, residual streams for recomputed segments.
// Thread-safety: immutable after construction; Encode may run concurrently.
#ifndef SCD_CODEC_CODE_ENCODER_H_
#define SCD_CODEC_CODE_ENCODER_H_

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "codec/artifact.h"
#include "codec/code_batch.h"
#include "codec/transfer_plan.h"
#include "model/llama_model.h"

namespace scd {

// A chunk a plan will send, known before it is encoded: what a streaming producer announces in its
// header and a consumer checks arrivals against.
struct PlannedChunk {
  int layer = 0;
  PayloadKind kind = PayloadKind::kKeyCode;
  WireDtype dtype = WireDtype::kF16;
  std::vector<int64_t> shape;
  int64_t bytes = 0;  // data + scales on the wire
};
// What a plan's chunks put on the wire, in all.
int64_t TotalBytes(const std::vector<PlannedChunk>& chunks);
// The chunks of layers [layer_begin, ...): what a takeover sends (TransferHeader.layer_begin).
std::vector<PlannedChunk> ChunksFromLayer(const std::vector<PlannedChunk>& chunks, int layer_begin);

class CodeEncoder {
 public:
  // REQUIRES: `artifact` (may be null for modes without one) outlives the encoder.
  CodeEncoder(TransferPlan plan, const Artifact* artifact, TransferOptions options);

  const TransferPlan& plan() const { return plan_; }
  // Encodes captures of a prefill over `tokens` positions.
  absl::StatusOr<CodeBatch> Encode(const Captures& captures, int64_t tokens) const;
  // The chunks layer `layer` contributes, from that layer's capture alone (its codes or raw K/V,
  // and the residual stream entering it when a recomputed segment starts there): what a producer
  // sends as soon as the layer has run (ForwardOptions::on_layer). Over every layer these are
  // exactly Encode's chunks (in layer order). Empty for layers the plan sends nothing for.
  absl::StatusOr<std::vector<CodeChunk>> EncodeLayer(int layer, const LayerCapture& capture,
                                                     int64_t tokens) const;
  // Every chunk Encode / EncodeLayer will produce for a prefill of `tokens` positions of
  // `producer` (the model the plan was made for), in EncodeLayer's order, with shapes and bytes.
  absl::StatusOr<std::vector<PlannedChunk>> PlannedChunks(const ModelConfig& producer,
                                                          int64_t tokens) const;
  // Runs the producer's prefill over `tokens` (capturing what the plan needs) and encodes it.
  absl::StatusOr<CodeBatch> Prefill(const LlamaModel& producer,
                                    absl::Span<const TokenId> tokens) const;

 private:
  // Appends the layer's payload chunks (not the segment residual) to `chunks`.
  absl::Status AppendLayerPayload(int layer, const LayerCapture& capture, int64_t tokens,
                                  std::vector<CodeChunk>* chunks) const;
  bool StartsRecomputedSegment(int layer) const;

  TransferPlan plan_;
  const Artifact* artifact_;
  TransferOptions options_;
};

}  // namespace scd

#endif  // SCD_CODEC_CODE_ENCODER_H_
