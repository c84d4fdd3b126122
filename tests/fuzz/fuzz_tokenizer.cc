// libFuzzer target: tokenizer.json from outside (normalizers, pre-tokenizers, BPE/Unigram models,
// added tokens, decoders). A tokenizer that loads must encode and decode without failing hard.
#include <cstdint>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto tokenizer =
      scd::Tokenizer::FromJson(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!tokenizer.ok()) return 0;
  auto ids = (*tokenizer)->Encode("Once upon a time, caf\xc3\xa9 \xe2\x96\x81<s> 123!");
  if (ids.ok()) (void)(*tokenizer)->Decode(*ids);
  std::vector<scd::TokenId> some;
  for (int32_t id = -2; id < 40; ++id) some.push_back(id);
  (void)(*tokenizer)->Decode(some, /*skip_special_tokens=*/true);
  return 0;
}
