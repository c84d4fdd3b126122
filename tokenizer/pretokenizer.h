// Pre-tokenizers of tokenizer.json (the `pre_tokenizer` field): they split normalized text into
// the "words" that the model tokenizes independently, and may rewrite them (ByteLevel maps bytes
// to printable characters, Metaspace replaces spaces).
//
// Thread-safety: a parsed PreTokenizer is immutable; PreTokenize is safe from many threads.
#ifndef SCD_TOKENIZER_PRETOKENIZER_H_
#define SCD_TOKENIZER_PRETOKENIZER_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "tokenizer/json.h"

namespace scd::tokenizer_internal {

// One piece of text on its way to the model.
struct PreToken {
  std::string text;
  // Whether the piece begins at offset 0 of the original input (Metaspace's "first" scheme).
  bool at_origin = false;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces each piece by its sub-pieces, in order; empty sub-pieces are dropped as in HF's
  // PreTokenizedString::split.
  // REQUIRES: every piece is valid UTF-8.
  virtual void PreTokenize(std::vector<PreToken>* pieces) const = 0;
};

// Builds a pre-tokenizer from its JSON object at `path` (Sequence, ByteLevel, Split, Metaspace,
// Whitespace, WhitespaceSplit, Digits, Punctuation, BertPreTokenizer).
absl::StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const Json& json,
                                                                std::string_view path);

}  // namespace scd::tokenizer_internal

#endif  // SCD_TOKENIZER_PRETOKENIZER_H_
