// Decoders of tokenizer.json (the `decoder` field): they turn the token strings of an id sequence
// back into text. Like HF's Decoder::decode_chain, each step maps a list of strings to a list of
// strings; the final text is their concatenation.
//
// Thread-safety: a parsed Decoder is immutable; DecodeChain is safe from many threads.
#ifndef SCD_TOKENIZER_DECODER_H_
#define SCD_TOKENIZER_DECODER_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "tokenizer/json.h"

namespace scd::tokenizer_internal {

class Decoder {
 public:
  virtual ~Decoder() = default;
  // Rewrites the list of token strings in place.
  virtual void DecodeChain(std::vector<std::string>* tokens) const = 0;
};

// Builds a decoder from its JSON object at `path` (Sequence, Replace, ByteFallback, Fuse, Strip,
// ByteLevel, Metaspace, BPEDecoder).
absl::StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const Json& json, std::string_view path);

}  // namespace scd::tokenizer_internal

#endif  // SCD_TOKENIZER_DECODER_H_
