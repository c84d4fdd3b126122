// Generation loops on top of LlamaModel: token-level (used by consumers that start from a rebuilt
// cache) and text-level (tokenize, stream UTF-8-safe text pieces).
// Thread-safety: the functions are reentrant; each call drives its own cache and sampler.
#ifndef SCD_MODEL_GENERATOR_H_
#define SCD_MODEL_GENERATOR_H_

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/token_id.h"
#include "model/kv_cache.h"
#include "model/llama_model.h"
#include "model/sampler.h"

namespace scd {

class Tokenizer;

struct GenerationOptions {
  int max_tokens = 128;                 // new tokens at most
  SamplingParams sampling;              // greedy by default
  std::vector<TokenId> stop_token_ids;  // empty: the model's eos ids
  bool ignore_eos = false;              // keep going past eos (benchmarks, goldens)
  bool add_bos = true;                  // text-level: let the tokenizer add its special tokens
  // Text-level: stop when the output contains one of these; the text ends before it. Streamed
  // text never shows a partial match (a possible start of a stop string is held back).
  std::vector<std::string> stop_strings;
};

struct GenerationResult {
  std::vector<TokenId> prompt_ids;
  std::vector<TokenId> output_ids;  // excludes the stop token
  std::string text;                 // text-level only
  std::string finish_reason;        // "stop", "length" or "max_positions"
  double prefill_seconds = 0;       // running the not-yet-cached prompt tokens, to first token
  double decode_seconds = 0;        // every later step
};

// Called per new token; return false to stop early ("stop").
using TokenCallback = std::function<bool(TokenId)>;
// Called per text piece (never half a UTF-8 character).
using TextCallback = std::function<void(std::string_view)>;

// Finds stop strings in streamed text: Add() passes on what can no longer be part of a match
// and returns true (after emitting the text before it) once a stop string is complete.
// Thread-safety: not thread-safe; one per stream.
class StopStringMatcher {
 public:
  explicit StopStringMatcher(std::vector<std::string> stops);
  bool Add(std::string_view piece, const TextCallback& emit);
  // End of stream: emits whatever was held back.
  void Finish(const TextCallback& emit);

 private:
  std::vector<std::string> stops_;
  std::string pending_;  // held back: a suffix that is a proper prefix of some stop string
};

// Runs `prompt_ids[cache->length():]` (at least one token: the last prompt token's logits seed
// sampling) then samples up to max_tokens. A cache already holding a prefix (native or rebuilt
// from transferred codes) is continued as is.
absl::StatusOr<GenerationResult> GenerateTokens(const LlamaModel& model,
                                                absl::Span<const TokenId> prompt_ids,
                                                KvCache* cache, const GenerationOptions& options,
                                                const TokenCallback& on_token = nullptr);

// Tokenizes `prompt`, generates and streams decoded text.
absl::StatusOr<GenerationResult> GenerateText(const LlamaModel& model, const Tokenizer& tokenizer,
                                              std::string_view prompt,
                                              const GenerationOptions& options,
                                              const TextCallback& on_text = nullptr);
// The same from prompt ids; the streamed text continues Decode(prompt_ids) (the prompt is the
// detokenizer's left context), honouring stop strings.
absl::StatusOr<GenerationResult> GenerateTextFromIds(const LlamaModel& model,
                                                     const Tokenizer& tokenizer,
                                                     absl::Span<const TokenId> prompt_ids,
                                                     const GenerationOptions& options,
                                                     const TextCallback& on_text = nullptr);

}  // namespace scd

#endif  // SCD_MODEL_GENERATOR_H_
