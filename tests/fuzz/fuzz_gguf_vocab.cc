// libFuzzer target: a tokenizer.json from outside as `scd export-gguf` reads it into GGUF
// metadata (model/gguf_vocab.h): any bytes either give a vocabulary of the model's size or an
// error, never a crash or an index outside the vocabulary.
#include <cstdint>
#include <string_view>

#include "model/gguf_vocab.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  scd::ModelConfig config;
  config.vocab_size = 512;
  config.bos_token_id = 1;
  config.eos_token_ids = {2};
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto vocabulary = scd::VocabularyFromJson(text, "", config, "fuzz");
  if (vocabulary.ok() && vocabulary->tokens.size() != 512) __builtin_trap();
  return 0;
}
