// Generation loops on top of LlamaModel: token-level (used by consumers that start from a rebuilt
// cache) and text-level (tokenize, stream UTF-8-safe text pieces).
// Thread-safety: the functions are reentrant; each call drives its own cache and sampler.
#ifndef SCD_MODEL_GENERATOR_H_
#define SCD_MODEL_GENERATOR_H_

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/finish_reason.h"
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
  // > 0: per generated token, its log-probability and the `top_logprobs` most likely tokens at
  // that position (the model's own distribution: log_softmax of the logits, before temperature,
  // top-k and top-p), handed to a TokenLogprobsCallback.
  int top_logprobs = 0;
};

// One candidate at a generated position.
struct TopLogprob {
  TokenId id = 0;
  float logprob = 0;  // natural log
};

// The log-probabilities at one generated position (options.top_logprobs > 0).
struct TokenLogprobs {
  TokenId id = 0;                // the token generated
  float logprob = 0;             // its log-probability
  std::vector<TopLogprob> top;   // top_logprobs entries, most likely first, ties by lower id
};

// The log-probabilities of `logits` ([vocab] or [1, vocab], any device or dtype) for `chosen`
// and the `k` most likely tokens (computed in float32, then double for the normaliser).
TokenLogprobs LogprobsOf(const at::Tensor& logits, TokenId chosen, int k);

struct GenerationResult {
  std::vector<TokenId> prompt_ids;
  std::vector<TokenId> output_ids;  // excludes the stop token
  std::string text;                 // text-level only
  FinishReason finish_reason = FinishReason::kNone;  // stop, length or max_positions
  double prefill_seconds = 0;       // running the not-yet-cached prompt tokens, to first token
  double decode_seconds = 0;        // every later step
};

// Called per new token; return false to stop early ("stop").
using TokenCallback = std::function<bool(TokenId)>;
// Called per new token with its log-probabilities (empty `top` and 0 when options.top_logprobs
// is 0); return false to stop early ("stop").
using TokenLogprobsCallback = std::function<bool(TokenId, const TokenLogprobs&)>;
// One sequence's generation after its prompt: picks each next token from the logits (its own
// seeded sampler, stop ids, max_tokens, the model's positions) and says when and why it ends.
// GenerateTokensWithLogprobs drives one alone; the consumer's scheduler drives many, each step a
// batched forward (consumer/decode_scheduler.h). Thread-safety: not thread-safe; one per sequence.
class GenerationState {
 public:
  // REQUIRES: options.sampling.Validate().ok(), options.max_tokens >= 0.
  GenerationState(const ModelConfig& config, const GenerationOptions& options);

  // Takes the logits ([1, vocab] or [vocab]) after the sequence's last input, with `positions`
  // the positions its cache holds now (also the sampled token's position: what a seeded draw is
  // keyed on, model/sampler.h). Returns the token to run next, or nullopt once the
  // sequence ended (finish_reason()). `on_token` (may be null) gets every output token with its
  // log-probabilities; its false ends the sequence ("stop").
  std::optional<TokenId> Next(const at::Tensor& logits, int64_t positions,
                              const TokenLogprobsCallback& on_token);

  bool done() const { return done_; }
  // kStop, kLength or kMaxPositions; kNone until done().
  FinishReason finish_reason() const { return finish_reason_; }
  const std::vector<TokenId>& output_ids() const { return output_ids_; }

 private:
  void End(FinishReason reason);

  GenerationOptions options_;
  std::vector<TokenId> stops_;
  int64_t max_positions_;
  Sampler sampler_;
  std::vector<TokenId> output_ids_;
  bool done_ = false;
  FinishReason finish_reason_ = FinishReason::kNone;
};

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
// The same, handing each token's log-probabilities to `on_token`. With `first_logits` (float32
// [1, vocab]: the last prompt token's, e.g. from a LayerStepper that ran it while the cache was
// rebuilt) the cache already holds every prompt position and sampling starts from them.
absl::StatusOr<GenerationResult> GenerateTokensWithLogprobs(
    const LlamaModel& model, absl::Span<const TokenId> prompt_ids, KvCache* cache,
    const GenerationOptions& options, const TokenLogprobsCallback& on_token,
    const at::Tensor* first_logits = nullptr);

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
