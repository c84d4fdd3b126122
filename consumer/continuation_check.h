// A moved or resumed stream's received ids (DecodeRequest.continued_ids) on the consumer that
// continues it: ContinueStream appends them to the prompt once they are range-checked, and
// ContinuationCheck judges a greedy stream's by this replica's own prefill. Each received id is
// judged by the logits of the position before it: its gap is the top logit minus the id's (0
// when the id is a top pick; the difference of the two log-probabilities). A gap within the
// model's near-tie bound (LlamaModel::NearTieBound: what a batched step's logits may differ by
// from a lone one's) agrees; beyond it the id parted.
// When every received id was decoded on a cache the model computed itself (local prefill on each
// replica that streamed them, and here: `exact`), greedy decoding repeats them up to a near-tie,
// so a parted id is not this model's output: the stream is refused (INVALID_ARGUMENT) -- a
// client cannot pass its own text off as the model's through a resume. Otherwise (ids decoded
// from a rebuilt cache, whose logits legitimately differ from a local prefill's, or of unknown
// origin) parted ids are only counted (Finished.continuation), never refused.
// Thread-safety: not thread-safe; one sequence's rows come in order on the scheduler's thread.
#ifndef SCD_CONSUMER_CONTINUATION_CHECK_H_
#define SCD_CONSUMER_CONTINUATION_CHECK_H_

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "base/token_id.h"
#include "consumer/request_runner.h"
#include "scd/v1/inference.pb.h"

namespace scd::consumer {

// A moved stream's continuation (DecodeRequest.continued_ids) after the checked prompt `*ids`:
// appended, and route->continued set. INVALID_ARGUMENT for an early-prefill route, an id
// outside the vocabulary, or as many ids as max_tokens (the consumer's default when unset) allows
// or more; OUT_OF_RANGE when the prompt, the continued ids and the tokens left exceed the model's
// positions. Nothing continued: nothing changes.
absl::Status ContinueStream(const ConsumerModel& consumer, const v1::GenerateRequest& request,
                            absl::Span<const int32_t> continued, TargetRoute* route,
                            std::vector<TokenId>* ids);

class ContinuationCheck {
 public:
  // `ids`: the prompt then the `continued` received ids (not owned; outlives the check).
  // `tie`: the near-tie bound of the model that judges. REQUIRES: 0 < continued < ids.size().
  ContinuationCheck(absl::Span<const TokenId> ids, int64_t continued, double tie, bool exact);

  // The first position whose logits judge a received id: the prompt's last.
  int64_t first_position() const { return first_; }
  // Judges float32 logits [rows, vocab] of positions [first, first + rows): the row of each
  // position p from first_position() to the second-to-last id judges ids[p + 1]; other rows are
  // ignored, and a position judged already is not judged again. INVALID_ARGUMENT: an exact
  // check's parted id (naming it), or logits of another shape.
  absl::Status Judge(int64_t first, const at::Tensor& logits);

  // What was judged so far (Finished.continuation).
  const v1::ContinuationChecked& tally() const { return tally_; }

 private:
  const absl::Span<const TokenId> ids_;
  const int64_t first_;  // ids.size() - continued - 1
  const double tie_;
  int64_t next_;  // the next position to judge
  v1::ContinuationChecked tally_;
};

}  // namespace scd::consumer

#endif  // SCD_CONSUMER_CONTINUATION_CHECK_H_
