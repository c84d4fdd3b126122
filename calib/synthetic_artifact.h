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

}  // namespace scd

#endif  // SCD_CALIB_SYNTHETIC_ARTIFACT_H_
