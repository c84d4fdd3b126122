// GgufVocabulary: a model's tokenizer as GGUF metadata (tokenizer.ggml.*), the way llama.cpp's
// convert_hf_to_gguf.py writes it, from a Hugging Face tokenizer.json:
// - BPE with byte fallback (SentencePiece's models rebuilt as tokenizer.json, such as Llama 2's and
//   this project's tok512): model "llama" -- tokens, scores and token types. SentencePiece merges
//   the adjacent pair whose joined piece scores highest; a piece's score here is minus the rank of
//   the merge that makes it, so both merge in the same order.
// - byte-level BPE (GPT-2, Qwen2, SmolLM2): model "gpt2" -- tokens, token types and the merges.
// - no tokenizer (dummy weights): a placeholder "llama" vocabulary of the config's size: the
//   config's BOS/EOS ids as control tokens, <unk> at 0 when that is free, the 256 byte tokens,
//   then pieces "▁tN". Token ids are
//   what a benchmark passes; text through it means nothing.
// Token types are llama.cpp's: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
// Thread-safety: stateless functions.
#ifndef SCD_MODEL_GGUF_VOCAB_H_
#define SCD_MODEL_GGUF_VOCAB_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "model/config.h"
#include "model/gguf_writer.h"

namespace scd {

struct GgufVocabulary {
  std::string model;  // "llama" or "gpt2"
  std::string kind;   // one line for reports: where it came from
  std::vector<std::string> tokens;
  std::vector<float> scores;    // "llama" only
  std::vector<int32_t> types;
  std::vector<std::string> merges;  // "gpt2" only: "a b"
  std::optional<int64_t> bos, eos, unk;
  bool add_bos = false;

  // Writes the tokenizer.ggml.* keys.
  void AddTo(GgufWriter* writer) const;
};

// From tokenizer.json (and, when it exists, tokenizer_config.json beside it for add_bos_token),
// padded with unused tokens to the config's vocabulary size. INVALID_ARGUMENT: a tokenizer that is
// not BPE, more tokens than the model has rows, or a file that does not parse.
absl::StatusOr<GgufVocabulary> VocabularyFromTokenizerJson(const std::string& path,
                                                           const ModelConfig& config);
// The same from the files' contents (`tokenizer_config` "" when there is none); `source` names
// them in errors. Any bytes: a malformed document is INVALID_ARGUMENT (tests/fuzz).
absl::StatusOr<GgufVocabulary> VocabularyFromJson(std::string_view tokenizer_json,
                                                  std::string_view tokenizer_config,
                                                  const ModelConfig& config,
                                                  const std::string& source);
// The placeholder vocabulary for dummy weights.
GgufVocabulary PlaceholderVocabulary(const ModelConfig& config);

}  // namespace scd

#endif  // SCD_MODEL_GGUF_VOCAB_H_
