// ModelPair: a producer and a consumer loaded together with the tokenizer they share. SCD needs
// identical tokenization on both sides (the consumer continues the producer's token positions),
// so a consumer directory with a different tokenizer.json is refused.
// Thread-safety: immutable after Load(); the models' own rules apply.
#ifndef SCD_CALIB_MODEL_PAIR_H_
#define SCD_CALIB_MODEL_PAIR_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "model/llama_model.h"
#include "tokenizer/tokenizer.h"

namespace scd {

struct ModelPair {
  std::unique_ptr<LlamaModel> producer, consumer;
  std::unique_ptr<Tokenizer> tokenizer;  // the producer's tokenizer.json

  // Each model at its own precision (a consumer calibrated at the weights it serves with).
  static absl::StatusOr<ModelPair> Load(const std::string& producer_dir,
                                        const std::string& consumer_dir,
                                        const LlamaModel::Options& producer_options = {},
                                        const LlamaModel::Options& consumer_options = {});
};

}  // namespace scd

#endif  // SCD_CALIB_MODEL_PAIR_H_
