// TransferPlan: the per-layer plan one transfer mode (codec/transfer_mode.h) implies for a
// request: what travels for each layer, at which ranks, and what the producer must capture.
// Thread-safety: plain value types.
#ifndef SCD_CODEC_TRANSFER_PLAN_H_
#define SCD_CODEC_TRANSFER_PLAN_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "codec/artifact.h"
#include "codec/code_batch.h"
#include "codec/transfer_mode.h"
#include "model/llama_model.h"

namespace scd {

struct TransferOptions {
  WireDtype raw_dtype = WireDtype::kF16;   // raw mode and recompute's raw layers
  WireDtype code_dtype = WireDtype::kF16;  // reuse / scd codes
  // Code ranks; 0 keeps the artifact's, smaller values truncate the nested codes.
  int64_t rank_k = 0, rank_v = 0, rank_h = 0;
  // Per-layer ranks (a frontier point, codec/frontier.h): when not empty, one entry per layer,
  // taking precedence over the scalar ranks above; 0 again keeps the artifact's rank.
  std::vector<int64_t> layer_rank_k, layer_rank_v, layer_rank_h;

  // `base` (a node's options) sending exactly `point`: its precision and every layer's ranks.
  static TransferOptions AtPoint(const FrontierPoint& point, TransferOptions base);
  static TransferOptions AtPoint(const FrontierPoint& point);  // from the default options
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
  // Per-layer ranks of the wrong length or negative are refused (InvalidArgument).
  static absl::StatusOr<TransferPlan> Make(TransferMode mode, const ModelConfig& producer,
                                           const Artifact* artifact,
                                           const TransferOptions& options);
};

}  // namespace scd

#endif  // SCD_CODEC_TRANSFER_PLAN_H_
