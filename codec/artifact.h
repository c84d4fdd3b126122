// Artifact: everything calibration learned for one producer -> consumer pair, in one safetensors
// file. Tensors hold the per-layer reuse translators (K and V, every layer) and the patch aligners
// (patch layers); `__metadata__` holds the format version, both models' fingerprints, names and
// rope configs, the per-layer route (reuse or patch), ranks, the fit method, the frontier
// (codec/frontier.h), the calibration summary, the layer-policy trace and the fidelity measured at
// fit time, plus a SHA-256 of all tensor bytes so corruption is caught on load. Thread-safety: a
// loaded Artifact is immutable; safe to share.
#ifndef SCD_CODEC_ARTIFACT_H_
#define SCD_CODEC_ARTIFACT_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "codec/frontier.h"
#include "codec/patch_aligner.h"
#include "codec/reuse_translator.h"
#include "model/config.h"
#include "model/llama_model.h"

namespace scd {

// 2: the recompute plan is a typed field (scd.recompute_layers). 3: reuse maps may be folded
// over heads (per-head ranks: ReuseTranslator::FoldHeads; `<prefix>.column_heads` names each
// code column's head); written only when one is, so artifacts without stay readable at 2.
// Version-1 files still load (the plan is read from their policy document); others are refused.
inline constexpr int kArtifactFormatVersion = 3;

enum class LayerRoute { kReuse, kPatch };
std::string LayerRouteName(LayerRoute route);

// Who an artifact was fitted for.
struct ModelIdentity {
  std::string name;         // directory name, informational
  std::string fingerprint;  // FingerprintModel()
  RopeConfig rope;
  int64_t layers = 0, kv_heads = 0, head_dim = 0, hidden = 0;
  // The weight precision it was fitted and measured at (model/runtime.h: "f32", "bf16", "f16",
  // "int8"): a consumer serving at another precision rebuilds with other weights than the fit saw
  // (PrecisionMismatch). Files from before precisions: "f32".
  std::string precision = "f32";

  static absl::StatusOr<ModelIdentity> Of(const LlamaModel& model);
};

// Fidelity measured with the consumer at another weight precision than the fit's (`scd-calib eval
// --consumer-dtype P --record FILE`): a precision the consumer may serve the artifact at.
struct PrecisionMeasurement {
  std::string precision;  // "bf16", "f16", "int8", ...
  double kl = 0;          // scd's mean KL against that consumer's own prefill, nats
  double bytes_per_token = 0;
  double ppl_ratio = 0;
  int64_t windows = 0;
  std::string data;  // the evaluation text's file name
};

struct ArtifactLayer {
  LayerRoute route = LayerRoute::kReuse;
  ReuseTranslator key, value;         // every layer (reuse-only mode uses them all)
  std::optional<PatchAligner> patch;  // patch layers
};

struct Artifact {
  ModelIdentity producer, consumer;
  std::vector<ArtifactLayer> layers;
  std::string fit_method;
  // Layers the DroidSpeak-style recompute baseline recomputes, chosen at fit time.
  std::vector<int> recompute_layers;
  // JSON documents kept verbatim in the metadata (empty: "{}").
  std::string calibration_json;  // data, prefixes, tokens, ridge, seeds, timings
  std::string policy_json;       // restore-one sensitivities, greedy trace, chosen k
  std::string fidelity_json;     // metrics measured at fit time on the held-out split
  // Quality against bytes over per-layer ranks and code precisions (empty: not fitted; artifacts
  // from before the frontier load with none).
  Frontier frontier;
  // Consumer precisions other than the fit's at which scd was measured (metadata
  // scd.precision_fidelity), at most one per precision.
  std::vector<PrecisionMeasurement> measured;

  const PrecisionMeasurement* MeasuredAt(const std::string& precision) const;
  // Adds `m`, replacing an earlier measurement at its precision.
  void Record(PrecisionMeasurement m);

  std::vector<int> PatchLayers() const;
  // The ranks scd mode sends at most per layer (K/V on reuse layers, H on patch layers).
  RankLimits FrontierLimits() const;

  absl::Status Save(const std::string& path) const;
  // Validates the file (safetensors structure, version, tensor checksum, shapes, routes).
  static absl::StatusOr<Artifact> Load(const std::string& path);
  // Load() plus a check that `producer` and `consumer` are the models it was fitted for.
  static absl::StatusOr<Artifact> LoadFor(const std::string& path, const LlamaModel& producer,
                                          const LlamaModel& consumer);
  absl::Status CheckModels(const LlamaModel& producer, const LlamaModel& consumer) const;
};

// Whether a consumer at `consumer_precision` may use `artifact`: OK when it was fitted at that
// precision or measured at it (Artifact::measured; the node logs that measurement); otherwise
// FAILED_PRECONDITION naming both precisions, the fidelity measured at fit time (scd's KL and its
// bytes per token) and how to measure or fit one at the consumer's precision. A node that allows
// the mismatch (--allow-precision-mismatch) logs that message as a warning instead.
absl::Status CheckConsumerPrecision(const Artifact& artifact, const std::string& consumer_precision);

// The id an artifact file is known by across nodes (registry, routing, transfer headers): the
// first 16 hex digits of the file's SHA-256.
absl::StatusOr<std::string> ArtifactFileId(const std::string& path);

}  // namespace scd

#endif  // SCD_CODEC_ARTIFACT_H_
