#include "consumer/continuation_check.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace scd::consumer {

absl::Status ContinueStream(const ConsumerModel& consumer, const v1::GenerateRequest& request,
                            absl::Span<const int32_t> continued, TargetRoute* route,
                            std::vector<TokenId>* ids) {
  if (continued.empty()) return absl::OkStatus();
  if (route->early_prefill) {  // its session would hold codes for a prompt without them
    return absl::InvalidArgumentError("continued_ids: not with early_prefill");
  }
  const ModelConfig& config = consumer.model->config();
  for (size_t i = 0; i < continued.size(); ++i) {
    if (continued[i] < 0 || continued[i] >= config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("continued_ids[", i, "] = ", continued[i],
                                                     ": outside the vocabulary of ",
                                                     config.vocab_size));
    }
  }
  const int64_t n = static_cast<int64_t>(continued.size());
  const int64_t max_tokens =
      request.max_tokens() > 0 ? request.max_tokens() : consumer.default_max_tokens;
  if (n >= max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("continued_ids: ", n,
                                                   " tokens streamed already, max_tokens ",
                                                   max_tokens, " leaves none to generate"));
  }
  const int64_t positions = static_cast<int64_t>(ids->size()) + max_tokens;
  if (positions > config.max_position_embeddings) {
    return absl::OutOfRangeError(absl::StrCat(
        "continued_ids: the prompt's ", ids->size(), " tokens and max_tokens ", max_tokens,
        " exceed the ", config.max_position_embeddings, " positions of ", consumer.name));
  }
  ids->insert(ids->end(), continued.begin(), continued.end());
  route->continued = n;
  return absl::OkStatus();
}

ContinuationCheck::ContinuationCheck(absl::Span<const TokenId> ids, int64_t continued, double tie,
                                     bool exact)
    : ids_(ids),
      first_(static_cast<int64_t>(ids.size()) - continued - 1),
      tie_(tie),
      next_(first_) {
  tally_.set_exact(exact);
}

absl::Status ContinuationCheck::Judge(int64_t first, const at::Tensor& logits) {
  if (logits.dim() != 2 || logits.scalar_type() != at::kFloat) {
    return absl::InvalidArgumentError("continuation check: logits are not float32 [rows, vocab]");
  }
  const at::Tensor rows = logits.contiguous();
  const int64_t vocab = rows.size(1);
  const float* data = rows.data_ptr<float>();
  const int64_t last = static_cast<int64_t>(ids_.size()) - 2;  // the last position judging an id
  for (int64_t p = std::max(first, next_); p <= std::min(last, first + rows.size(0) - 1); ++p) {
    const float* row = data + (p - first) * vocab;
    const TokenId id = ids_[static_cast<size_t>(p + 1)];
    const int64_t received = p - first_;  // its index among the received ids
    if (id < 0 || id >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("continued_ids[", received, "] = ", id,
                                                     ": outside the vocabulary of ", vocab));
    }
    const double gap = static_cast<double>(*std::max_element(row, row + vocab) - row[id]);
    next_ = p + 1;
    tally_.set_checked(tally_.checked() + 1);
    tally_.set_worst_gap(std::max(tally_.worst_gap(), gap));
    if (gap <= tie_) continue;
    tally_.set_parted(tally_.parted() + 1);
    if (tally_.exact()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "continued_ids[%d] = %d is not this model's greedy pick there: its logit is %.4g below "
          "the top's, beyond the near-tie bound %.3g, although every id was decoded on a locally "
          "prefilled cache of this model",
          received, id, gap, tie_));
    }
  }
  return absl::OkStatus();
}

}  // namespace scd::consumer
