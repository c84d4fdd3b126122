// Synthetic artifacts: random orthonormal translators at given ranks for a producer -> consumer
// pair that has no calibration data (dummy-weight models at the shapes of real ones: speed and
// overlap work on TinyLlama-, Llama- or Qwen-sized configs). Encoders are orthonormal projections
// (the first r columns of a random Gaussian's QR factor), decoders an independent one transposed,
// means zero; patch layers get a linear aligner over a random orthonormal basis. The codes carry
// no meaning across the pair -- only their shapes, bytes and costs are real.
// Thread-safety: stateless functions.
#ifndef SCD_CALIB_SYNTHETIC_ARTIFACT_H_
#define SCD_CALIB_SYNTHETIC_ARTIFACT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "codec/artifact.h"
#include "codec/frontier.h"
#include "codec/wire_dtype.h"
#include "model/llama_model.h"

namespace scd {

struct SyntheticArtifactOptions {
  int64_t key_rank = 32;              // per kv head, <= head_dim
  int64_t value_rank = 32;            // per kv head, <= head_dim
  std::vector<int> patch_layers;      // layers sent as hidden-state codes (scd mode)
  int64_t patch_rank = 64;            // <= hidden size
  std::vector<int> recompute_layers;  // for the recompute baseline
  uint64_t seed = 0;
};

// INVALID_ARGUMENT: the models differ in layers, kv heads or head dim, a rank is outside
// [1, dim], a layer outside the model.
absl::StatusOr<Artifact> SynthesizeArtifact(const LlamaModel& producer, const LlamaModel& consumer,
                                            const SyntheticArtifactOptions& options);

// A frontier for a synthesized artifact (dummy weights have nothing to measure quality on):
// every precision in `dtypes` at each of `fractions` of the artifact's ranks (rounded up, at least
// 1; nested), its bytes and encode / rebuild costs measured through the real codec on a random
// prompt of `probe_tokens`, its KL made up: full_kl x (the full point's bytes / the point's)^0.5,
// x 1.15 for int8 and x 1.5 for int4 codes. Kept where the KL falls with bytes; the fitted
// configuration (f16, full ranks) on top; recommended: the cheapest within 1.25x its KL.
// `heldout` says the KLs are made up. For timing benches of auto mode's choices only.
struct SyntheticFrontierOptions {
  std::vector<WireDtype> dtypes = {WireDtype::kF16, WireDtype::kInt8, WireDtype::kInt4};
  std::vector<double> fractions = {1, 0.75, 0.5, 0.25, 0.125};
  int64_t probe_tokens = 256;
  double full_kl = 0.02;
  uint64_t seed = 0;
};
absl::StatusOr<Frontier> SynthesizeFrontier(const LlamaModel& producer, const LlamaModel& consumer,
                                            const Artifact& artifact,
                                            const SyntheticFrontierOptions& options);

}  // namespace scd

#endif  // SCD_CALIB_SYNTHETIC_ARTIFACT_H_
