// SequenceStream: what streams one sequence's events. It is the scheduler's sink for one
// sequence (consumer/decode_scheduler.h): each token becomes a scd.v1 TokenDelta (its id; text
// held back only inside a UTF-8 character or a possible stop string; its log-probabilities when
// asked), handed to Options::on_event on the scheduler's thread as it is made, and
// Options::on_ended is told the end: no thread waits for the sequence. The scheduler never waits
// on a client: on_event queues (a slow reader slows only its own stream; its queue holds at most
// max_tokens events). When the sequence ended normally the text still held back is flushed. The
// terminal event (Finished or Error) is the caller's: it knows the route and the timings.
// Thread-safety: the sink callbacks come from the scheduler's thread; first_token() from any.
#ifndef SCD_CONSUMER_SEQUENCE_STREAM_H_
#define SCD_CONSUMER_SEQUENCE_STREAM_H_

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "consumer/decode_scheduler.h"
#include "model/generator.h"
#include "scd/v1/inference.pb.h"
#include "tokenizer/tokenizer.h"

namespace scd::consumer {

class SequenceStream final : public SequenceSink {
 public:
  struct Options {
    std::string target;                     // GenerateEvent.target
    const Tokenizer* tokenizer = nullptr;   // null: ids only (dummy weights), no stop strings
    std::vector<std::string> stop_strings;
    int top_logprobs = 0;
    // Called (scheduler thread) once every prompt position is in the cache.
    std::function<void(const KvCache&)> on_prompt_done;
    // Called (scheduler thread) with the prompt logits the sequence asked for
    // (SequenceSink::PromptLogits); its status ends the sequence when not OK. Unset: OK.
    std::function<absl::Status(int64_t first, const at::Tensor& logits)> on_prompt_logits;
    // Required: every event is handed here (scheduler thread; must not block), the held-back
    // text too, and then on_ended is called with how the sequence ended -- the stream's last act:
    // on_ended may destroy it.
    std::function<void(const v1::GenerateEvent&)> on_event;
    std::function<void(const SequenceEnd&)> on_ended;
  };
  // `prompt`: the detokenizer's left context. Its last `replayed` ids are outputs another replica
  // already streamed (a moved stream): they pass through the detokenizer and the stop strings as
  // tokens do, without an event, so the text goes on where that replica's stopped (what it held
  // back, inside a UTF-8 character or a possible stop string, is held here the same way).
  SequenceStream(Options options, absl::Span<const TokenId> prompt, size_t replayed = 0);

  void PromptDone(const KvCache& cache) override;
  absl::Status PromptLogits(int64_t first, const at::Tensor& logits) override;
  bool Token(TokenId id, const TokenLogprobs& logprobs) override;
  void Ended(const SequenceEnd& end) override;

  // When the first token's event was made (InfinitePast: none): the request's first token.
  absl::Time first_token() const;
  bool stopped_by_string() const;

 private:
  v1::GenerateEvent Delta(std::string text, std::optional<TokenId> id,
                          const TokenLogprobs* logprobs) const;
  // The text a normal end held back, as an event (nullopt: none). Once, after the last token.
  std::optional<v1::GenerateEvent> Rest(const SequenceEnd& end);

  const Options options_;
  // Scheduler thread.
  std::optional<StreamingDetokenizer> detok_;
  StopStringMatcher stops_;
  bool stop_string_ = false;

  mutable absl::Mutex mu_;
  absl::Time first_token_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace scd::consumer

#endif  // SCD_CONSUMER_SEQUENCE_STREAM_H_
