// Model fingerprints: a SHA-256 over a model's architecture (its parsed config) and every
// tensor's name, dtype, shape and bytes. An artifact records the fingerprints of the pair it was
// fitted on, so it is never applied to other weights by accident.
// Thread-safety: stateless functions.
#ifndef SCD_CODEC_FINGERPRINT_H_
#define SCD_CODEC_FINGERPRINT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "base/sha256.h"
#include "codec/served_model_spec.h"
#include "model/llama_model.h"
#include "tokenizer/tokenizer.h"

namespace scd {

// The architecture part: a canonical string of the fields that change the computation.
std::string CanonicalConfig(const ModelConfig& config);

// A model directory as stored (weights hashed straight from the mapped safetensors).
absl::StatusOr<std::string> FingerprintModelDir(const std::string& dir);
// A loaded model: from its directory when it has one, else from its in-memory weights.
absl::StatusOr<std::string> FingerprintModel(const LlamaModel& model);

// A model as a serving node loads it: the weights, the tokenizer.json beside them (required for
// a model directory; dummy weights without one serve token ids only: `tokenizer` null), the
// fingerprint, and the routing name.
struct ServedModel {
  std::string name, fingerprint;
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<Tokenizer> tokenizer;
};
absl::StatusOr<ServedModel> LoadServedModel(const ServedModelSpec& spec);

}  // namespace scd

#endif  // SCD_CODEC_FINGERPRINT_H_
