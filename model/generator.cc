#include "model/generator.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "base/exception_guard.h"
#include "base/status_macros.h"
#include "base/timer.h"
#include "tokenizer/tokenizer.h"

namespace scd {

TokenLogprobs LogprobsOf(const at::Tensor& logits, TokenId chosen, int k) {
  at::Tensor row = logits.reshape({-1}).to(at::kCPU, at::kFloat).contiguous();
  const float* data = row.data_ptr<float>();
  const int64_t n = row.numel();
  // log p_i = x_i - (max + log sum exp(x - max)), the sum in double.
  const float max_logit = *std::max_element(data, data + n);
  double total = 0;
  for (int64_t i = 0; i < n; ++i) total += std::exp(static_cast<double>(data[i] - max_logit));
  const double log_norm = static_cast<double>(max_logit) + std::log(total);
  auto logprob = [&](int64_t i) { return static_cast<float>(data[i] - log_norm); };
  TokenLogprobs out;
  out.id = chosen;
  out.logprob = chosen >= 0 && chosen < n ? logprob(chosen) : -INFINITY;
  const int64_t keep = std::clamp<int64_t>(k, 0, n);
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + keep, order.end(), [data](int32_t a, int32_t b) {
    return data[a] > data[b] || (data[a] == data[b] && a < b);
  });
  out.top.reserve(static_cast<size_t>(keep));
  for (int64_t i = 0; i < keep; ++i) out.top.push_back({order[i], logprob(order[i])});
  return out;
}

absl::StatusOr<GenerationResult> GenerateTokens(const LlamaModel& model,
                                                absl::Span<const TokenId> prompt_ids,
                                                KvCache* cache, const GenerationOptions& options,
                                                const TokenCallback& on_token) {
  TokenLogprobsCallback forward;
  if (on_token) forward = [&on_token](TokenId id, const TokenLogprobs&) { return on_token(id); };
  return GenerateTokensWithLogprobs(model, prompt_ids, cache, options, forward);
}

GenerationState::GenerationState(const ModelConfig& config, const GenerationOptions& options)
    : options_(options),
      stops_(options.stop_token_ids),
      max_positions_(config.max_position_embeddings),
      sampler_(options.sampling) {
  if (stops_.empty() && !options.ignore_eos) {
    for (int64_t id : config.eos_token_ids) stops_.push_back(static_cast<TokenId>(id));
  }
  if (options.max_tokens <= 0) End(FinishReason::kLength);
}

void GenerationState::End(FinishReason reason) {
  done_ = true;
  finish_reason_ = reason;
}

std::optional<TokenId> GenerationState::Next(const at::Tensor& logits, int64_t positions,
                                             const TokenLogprobsCallback& on_token) {
  if (done_) return std::nullopt;
  const TokenId next = sampler_.Sample(logits, positions);
  if (std::find(stops_.begin(), stops_.end(), next) != stops_.end()) {
    End(FinishReason::kStop);
    return std::nullopt;
  }
  output_ids_.push_back(next);
  const TokenLogprobs logprobs = options_.top_logprobs > 0
                                     ? LogprobsOf(logits, next, options_.top_logprobs)
                                     : TokenLogprobs{next, 0, {}};
  if (on_token && !on_token(next, logprobs)) {
    End(FinishReason::kStop);
    return std::nullopt;
  }
  if (static_cast<int64_t>(output_ids_.size()) >= options_.max_tokens) {
    End(FinishReason::kLength);
    return std::nullopt;
  }
  if (positions >= max_positions_) {
    End(FinishReason::kMaxPositions);
    return std::nullopt;
  }
  return next;
}

absl::StatusOr<GenerationResult> GenerateTokensWithLogprobs(
    const LlamaModel& model, absl::Span<const TokenId> prompt_ids, KvCache* cache,
    const GenerationOptions& options, const TokenLogprobsCallback& on_token,
    const at::Tensor* first_logits) {
  return GuardExceptions("GenerateTokens", [&]() -> absl::StatusOr<GenerationResult> {
    SCD_RETURN_IF_ERROR(options.sampling.Validate());
    if (options.max_tokens < 0) return absl::InvalidArgumentError("max_tokens must be >= 0");
    if (options.top_logprobs < 0) {
      return absl::InvalidArgumentError("top_logprobs must be >= 0");
    }
    const int64_t cached = cache->length();
    const int64_t prompt = static_cast<int64_t>(prompt_ids.size());
    if (first_logits != nullptr) {
      if (!cache->uniform() || cached != prompt) {
        return absl::InvalidArgumentError(absl::StrCat(
            "given the last prompt token's logits, the cache must hold all ", prompt,
            " prompt positions in every layer; it holds ", cache->length(0), " in layer 0"));
      }
      if (!first_logits->defined() || first_logits->numel() != model.config().vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the first logits must hold ", model.config().vocab_size, " values"));
      }
    } else if (!cache->uniform() || cached >= prompt) {
      return absl::InvalidArgumentError(
          absl::StrCat("the cache holds ", cached, " positions; at least the last of the ",
                       prompt_ids.size(), " prompt tokens must still be run to get logits"));
    }
    const int64_t max_positions = model.config().max_position_embeddings;
    if (static_cast<int64_t>(prompt_ids.size()) > max_positions) {
      return absl::OutOfRangeError(absl::StrCat("prompt of ", prompt_ids.size(),
                                                " tokens exceeds max_position_embeddings (",
                                                max_positions, ")"));
    }
    GenerationResult result;
    result.prompt_ids.assign(prompt_ids.begin(), prompt_ids.end());
    GenerationState state(model.config(), options);
    auto start = std::chrono::steady_clock::now();
    // The sequence's RoPE tables, built once for every position it can reach.
    const DecodeWorkspace workspace =
        model.NewWorkspace(static_cast<int64_t>(prompt_ids.size()) + options.max_tokens);
    const ForwardOptions forward{.logits = LogitsMode::kLast, .workspace = &workspace};
    ForwardOutput out;
    if (first_logits != nullptr) {
      out.logits = first_logits->reshape({1, -1});
    } else {
      SCD_ASSIGN_OR_RETURN(out, model.Forward(prompt_ids.subspan(cached), cache, forward));
    }
    for (bool first = true;; first = false) {
      const std::optional<TokenId> next = state.Next(out.logits, cache->length(), on_token);
      if (first) {
        result.prefill_seconds = SecondsSince(start);
        start = std::chrono::steady_clock::now();
      }
      if (!next.has_value()) break;
      const TokenId input[] = {*next};
      SCD_ASSIGN_OR_RETURN(out, model.Forward(input, cache, forward));
    }
    result.output_ids = state.output_ids();
    result.finish_reason = state.finish_reason();
    if (!result.output_ids.empty()) result.decode_seconds = SecondsSince(start);
    return result;
  });
}

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
}

bool StopStringMatcher::Add(std::string_view piece, const TextCallback& emit) {
  pending_.append(piece.data(), piece.size());
  size_t first = std::string::npos;
  for (const std::string& stop : stops_) first = std::min(first, pending_.find(stop));
  if (first != std::string::npos) {
    emit(std::string_view(pending_).substr(0, first));
    pending_.clear();
    return true;
  }
  // Hold back the longest suffix that could still grow into a stop string. Everything before it
  // has been checked, so a whole match always lies inside pending_.
  size_t hold = 0;
  for (const std::string& stop : stops_) {
    for (size_t n = std::min(stop.size() - 1, pending_.size()); n > hold; --n) {
      if (pending_.compare(pending_.size() - n, n, stop, 0, n) == 0) {
        hold = n;
        break;
      }
    }
  }
  emit(std::string_view(pending_).substr(0, pending_.size() - hold));
  pending_.erase(0, pending_.size() - hold);
  return false;
}

void StopStringMatcher::Finish(const TextCallback& emit) {
  emit(pending_);
  pending_.clear();
}

absl::StatusOr<GenerationResult> GenerateText(const LlamaModel& model, const Tokenizer& tokenizer,
                                              std::string_view prompt,
                                              const GenerationOptions& options,
                                              const TextCallback& on_text) {
  return GuardExceptions("GenerateText", [&]() -> absl::StatusOr<GenerationResult> {
    SCD_ASSIGN_OR_RETURN(std::vector<TokenId> ids, tokenizer.Encode(prompt, options.add_bos));
    if (ids.empty()) {
      return absl::InvalidArgumentError("the prompt tokenizes to nothing; give at least one token");
    }
    return GenerateTextFromIds(model, tokenizer, ids, options, on_text);
  });
}

absl::StatusOr<GenerationResult> GenerateTextFromIds(const LlamaModel& model,
                                                     const Tokenizer& tokenizer,
                                                     absl::Span<const TokenId> ids,
                                                     const GenerationOptions& options,
                                                     const TextCallback& on_text) {
  return GuardExceptions("GenerateTextFromIds", [&]() -> absl::StatusOr<GenerationResult> {
    KvCache cache =
        model.NewCache(std::min<int64_t>(model.config().max_position_embeddings,
                                         static_cast<int64_t>(ids.size()) + options.max_tokens));
    // The prompt is the detokenizer's left context: decoders such as SentencePiece's Strip treat
    // the first token of a text specially, and the continuation is not the start of the text.
    StreamingDetokenizer detok(tokenizer, /*skip_special_tokens=*/true);
    for (TokenId id : ids) detok.Push(id);
    std::string text;
    auto emit = [&](std::string_view piece) {
      if (piece.empty()) return;
      text.append(piece.data(), piece.size());
      if (on_text) on_text(piece);
    };
    StopStringMatcher stops(options.stop_strings);
    bool stopped = false;
    SCD_ASSIGN_OR_RETURN(GenerationResult result,
                         GenerateTokens(model, ids, &cache, options, [&](TokenId id) {
                           stopped = stops.Add(detok.Push(id), emit);
                           return !stopped;
                         }));
    if (!stopped) {
      stops.Add(detok.Flush(), emit);
      stops.Finish(emit);
    }
    result.text = std::move(text);
    return result;
  });
}

}  // namespace scd
