// Transfer modes (method.md) and the per-layer plan one mode implies for a request:
//   local      prompt only; the consumer runs its own prefill (the oracle)
//   raw        producer pre-RoPE K and V, f16
//   int4       the same, group-wise asymmetric int4
//   recompute  raw K/V on most layers; the consumer recomputes chosen layers from the hidden
//              state entering each recomputed segment (DroidSpeak-style)
//   reuse      reuse codes of K and V on every layer
//   scd        reuse codes on reuse layers, hidden-state codes on patch layers
// Thread-safety: plain value types.
#ifndef SCD_CODEC_TRANSFER_PLAN_H_
#define SCD_CODEC_TRANSFER_PLAN_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "codec/artifact.h"
#include "codec/code_batch.h"
#include "model/llama_model.h"

namespace scd {

enum class TransferMode { kLocal, kRaw, kInt4, kRecompute, kReuse, kScd };
std::string TransferModeName(TransferMode mode);
absl::StatusOr<TransferMode> ParseTransferMode(const std::string& name);
// "local,raw,scd" -> modes, in order, without duplicates.
absl::StatusOr<std::vector<TransferMode>> ParseTransferModes(const std::string& list);
// Whether the mode needs a fitted artifact.
bool ModeNeedsArtifact(TransferMode mode);

struct TransferOptions {
  WireDtype raw_dtype = WireDtype::kF16;   // raw mode and recompute's raw layers
  WireDtype code_dtype = WireDtype::kF16;  // reuse / scd codes
  // Code ranks; 0 keeps the artifact's, smaller values truncate the nested codes.
  int64_t rank_k = 0, rank_v = 0, rank_h = 0;
  // Recompute mode: layers the consumer recomputes; empty takes the artifact's plan.
  std::vector<int> recompute_layers;
};

// What travels for one layer.
enum class LayerPayload { kNone, kRaw, kInt4, kCodes, kPatch, kRecompute };

struct TransferPlan {
  TransferMode mode = TransferMode::kLocal;
  std::vector<LayerPayload> layers;
  // Recompute: maximal runs of recomputed layers [begin, end); a run starting at 0 is fed the
  // consumer's own embeddings (the tokens are known), others the producer's residual stream.
  std::vector<std::pair<int, int>> segments;
  // Per-layer ranks actually sent (0 where no code travels).
  std::vector<int64_t> rank_k, rank_v, rank_h;
  // What the producer's prefill has to capture.
  CaptureSpec capture;

  // REQUIRES for artifact modes: `artifact` fitted for a model shaped like `producer`.
  static absl::StatusOr<TransferPlan> Make(TransferMode mode, const ModelConfig& producer,
                                           const Artifact* artifact,
                                           const TransferOptions& options);
};

}  // namespace scd

#endif  // SCD_CODEC_TRANSFER_PLAN_H_
