#include "calib/model_pair.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "base/file_util.h"
#include "base/sha256.h"
#include "base/status_macros.h"

namespace scd {

absl::StatusOr<ModelPair> ModelPair::Load(const std::string& producer_dir,
                                          const std::string& consumer_dir,
                                          const LlamaModel::Options& producer_options,
                                          const LlamaModel::Options& consumer_options) {
  namespace fs = std::filesystem;
  ModelPair pair;
  SCD_ASSIGN_OR_RETURN(pair.producer, LlamaModel::Load(producer_dir, producer_options));
  SCD_ASSIGN_OR_RETURN(pair.consumer, LlamaModel::Load(consumer_dir, consumer_options));
  const std::string producer_tok = (fs::path(producer_dir) / "tokenizer.json").string();
  const std::string consumer_tok = (fs::path(consumer_dir) / "tokenizer.json").string();
  SCD_ASSIGN_OR_RETURN(std::string producer_bytes, ReadFileToString(producer_tok));
  SCD_ASSIGN_OR_RETURN(pair.tokenizer, Tokenizer::FromJson(producer_bytes));
  if (fs::exists(consumer_tok)) {
    SCD_ASSIGN_OR_RETURN(std::string consumer_bytes, ReadFileToString(consumer_tok));
    if (Sha256Hex(producer_bytes) != Sha256Hex(consumer_bytes)) {
      return absl::FailedPreconditionError(
          absl::StrCat("producer and consumer tokenizers differ (", producer_tok, " vs ",
                       consumer_tok, "): SCD needs identical tokenization on both sides"));
    }
  }
  return pair;
}

}  // namespace scd
