#include "consumer/sequence_stream.h"

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"

namespace scd::consumer {

SequenceStream::SequenceStream(Options options, absl::Span<const TokenId> prompt, size_t replayed)
    : options_(std::move(options)), stops_(options_.stop_strings) {
  if (options_.tokenizer == nullptr) return;
  detok_.emplace(*options_.tokenizer, /*skip_special_tokens=*/true);
  replayed = std::min(replayed, prompt.size());
  for (TokenId id : prompt.first(prompt.size() - replayed)) detok_->Push(id);
  // Streamed by another replica already: what it emitted is dropped, what it held back stays.
  for (TokenId id : prompt.last(replayed)) {
    stop_string_ = stops_.Add(detok_->Push(id), [](std::string_view) {}) || stop_string_;
  }
}

v1::GenerateEvent SequenceStream::Delta(std::string text, std::optional<TokenId> id,
                                        const TokenLogprobs* logprobs) const {
  v1::GenerateEvent e;
  e.set_target(options_.target);
  e.mutable_token()->set_text(std::move(text));
  if (id.has_value()) e.mutable_token()->add_ids(*id);
  if (logprobs != nullptr && options_.top_logprobs > 0) {
    v1::TokenLogprobs* lp = e.mutable_token()->add_logprobs();
    lp->set_id(logprobs->id);
    lp->set_logprob(logprobs->logprob);
    for (const TopLogprob& top : logprobs->top) {
      v1::TopLogprob* t = lp->add_top();
      t->set_id(top.id);
      t->set_logprob(top.logprob);
    }
  }
  return e;
}

absl::Status SequenceStream::PromptLogits(int64_t first, const at::Tensor& logits) {
  return options_.on_prompt_logits ? options_.on_prompt_logits(first, logits) : absl::OkStatus();
}

void SequenceStream::PromptDone(const KvCache& cache) {
  if (options_.on_prompt_done) options_.on_prompt_done(cache);
}

bool SequenceStream::Token(TokenId id, const TokenLogprobs& logprobs) {
  std::string piece;
  if (detok_.has_value()) {
    stop_string_ = stops_.Add(detok_->Push(id), [&](std::string_view p) { piece.append(p); });
  }
  v1::GenerateEvent e = Delta(std::move(piece), id, &logprobs);
  {
    absl::MutexLock lock(&mu_);
    if (first_token_ == absl::InfinitePast()) first_token_ = absl::Now();
  }
  options_.on_event(e);
  return !stop_string_;
}

void SequenceStream::Ended(const SequenceEnd& end) {
  if (std::optional<v1::GenerateEvent> rest = Rest(end)) options_.on_event(*rest);
  // The last act: on_ended may destroy this stream (its own copy runs).
  const std::function<void(const SequenceEnd&)> ended = options_.on_ended;
  ended(end);
}

std::optional<v1::GenerateEvent> SequenceStream::Rest(const SequenceEnd& end) {
  // The scheduler is done with the detokenizer: flush what a normal end held back.
  if (!end.status.ok() || stop_string_) return std::nullopt;
  std::string rest;
  if (detok_.has_value()) stops_.Add(detok_->Flush(), [&](std::string_view p) { rest.append(p); });
  stops_.Finish([&](std::string_view p) { rest.append(p); });
  if (rest.empty()) return std::nullopt;
  return Delta(std::move(rest), std::nullopt, nullptr);
}

absl::Time SequenceStream::first_token() const {
  absl::MutexLock lock(&mu_);
  return first_token_;
}

bool SequenceStream::stopped_by_string() const { return stop_string_; }

}  // namespace scd::consumer
