// Normalizers of tokenizer.json (the `normalizer` field): string-to-string rewrites applied to
// each piece of input text that is not an added token, before pre-tokenization. Offsets are not
// tracked because the tokenizer only reports ids.
//
// Thread-safety: a parsed Normalizer is immutable; Normalize is safe from many threads.
#ifndef SCD_TOKENIZER_NORMALIZER_H_
#define SCD_TOKENIZER_NORMALIZER_H_

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "tokenizer/json.h"

namespace scd::tokenizer_internal {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Rewrites `text` in place.
  // REQUIRES: `text` is valid UTF-8.
  virtual void Normalize(std::string* text) const = 0;
};

// Builds a normalizer from its JSON object at `path` (Sequence, Prepend, Replace, NFC, NFD, NFKC,
// NFKD, Lowercase, Strip). Unknown types are an error naming the type.
absl::StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const Json& json,
                                                            std::string_view path);

}  // namespace scd::tokenizer_internal

#endif  // SCD_TOKENIZER_NORMALIZER_H_
