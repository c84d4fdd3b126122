// The events a target on the consumer emits, made from what happened to it: its Started (as
// routing decided), the fallback notice, the Finished that says how its prefix came to be and its
// sequence ended (timings, lowered layers), and the Error. Pure functions: no model, no clock
// beyond the times they are given.
// Thread-safety: none needed (values in, values out).
#ifndef SCD_CONSUMER_TARGET_EVENTS_H_
#define SCD_CONSUMER_TARGET_EVENTS_H_

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "codec/transfer_mode.h"
#include "consumer/code_receiver.h"
#include "consumer/decode_scheduler.h"
#include "scd/v1/inference.pb.h"

namespace scd::consumer {

struct TargetRoute;

// How the prefix's cache came to be.
struct PrefixOutcome {
  TransferMode mode = TransferMode::kLocal;  // the mode actually used
  std::string reason;                        // and why
  int64_t cached_tokens = 0;                 // positions the prefix cache held (0 after a fallback)
  int64_t payload_bytes = 0;
  absl::Duration transfer = absl::ZeroDuration();
  absl::Duration rebuild = absl::ZeroDuration();
  absl::Duration patch = absl::ZeroDuration();
  absl::Duration last_rebuild = absl::ZeroDuration();
  std::vector<absl::Duration> layer_rebuild;  // per layer: the rebuild its chunks set off
  // Rebuilt from codes: the last prompt token's logits, run layer by layer as the cache was
  // rebuilt (the cache then holds the whole prompt), and the time its steps took.
  at::Tensor first_logits;
  absl::Duration tail = absl::ZeroDuration();
  std::vector<LoweredLayer> lowered;  // layers whose codes came below the plan's ranks
  uint32_t takeovers = 0;             // producers that took the transfer over (Finished.takeovers)
};

// "; the link fell behind: layers 5 (K 3, V 6), 7 (H 16) sent at lower ranks".
std::string LoweredText(const std::vector<LoweredLayer>& lowered);

// The target's Started event, as routing decided (the cached tokens and payload added later).
v1::GenerateEvent StartedEvent(const std::string& consumer, const v1::GenerateRequest& request,
                               const TargetRoute& route);

// The Started a target sends when its transfer failed and it runs its own prefill.
v1::GenerateEvent FallbackNotice(const v1::GenerateEvent& started, const PrefixOutcome& prefix);

// Whether a transfer that ended with `why` lost its producer (the producer gave the session up by
// its own failure, peer loss or the coordinator's report), so another producer may send the rest:
// not a check of this consumer's (a header or chunk refused, a corrupt chunk), a timeout, or a
// cancellation (this request's, or the producer's caller's: the coordinator's).
bool ProducerLost(const absl::Status& why);

// The control-plane notice of a transfer that lost its producer (GenerateEvent.transfer_lost):
// `layers_rebuilt` of the plan's layers kept, the plan's `chunks` say the bytes left.
v1::GenerateEvent TransferLostNotice(const std::string& consumer, uint32_t takeover,
                                     int layers_rebuilt, int layers, int64_t token_begin,
                                     size_t prompt_tokens, const std::vector<PlannedChunk>& chunks,
                                     const absl::Status& why);

// The Finished event of a target that decoded: how the prefix came to be and the sequence ended.
// `now`: its end.
v1::Finished FinishedOf(const PrefixOutcome& prefix, const SequenceEnd& end, size_t prompt_tokens,
                        absl::Time start, absl::Time first_token, absl::Time received,
                        absl::Time now);

// The Error a decode's end calls for (OK: it finished, or the client cancelled it); `budget`: the
// request's deadline, for the message.
absl::Status EndError(const SequenceEnd& end, absl::Duration budget);

// The Error event of a target that failed.
v1::GenerateEvent ErrorEvent(const std::string& consumer, const absl::Status& status);

}  // namespace scd::consumer

#endif  // SCD_CONSUMER_TARGET_EVENTS_H_
