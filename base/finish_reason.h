// Why a sequence ended: one list, named only at the edges (Finished.reason, the OpenAI API's
// finish_reason, logs). kNone: not ended (or ended by an error, which the terminal event's status
// says instead).
// Thread-safety: stateless functions.
#ifndef SCD_BASE_FINISH_REASON_H_
#define SCD_BASE_FINISH_REASON_H_

#include <string_view>

namespace scd {

enum class FinishReason {
  kNone,
  kStop,          // a stop token or string, or the caller ended it
  kLength,        // max_tokens reached
  kMaxPositions,  // the model's positions ran out (reported to clients as "length")
  kCancelled,     // the client cancelled
};

// "stop", "length", "max_positions", "cancelled"; "" for kNone.
std::string_view FinishReasonName(FinishReason reason);
// The reason a name says (a peer's Finished.reason); kNone for "" or a name this build does not
// know.
FinishReason ParseFinishReason(std::string_view name);

}  // namespace scd

#endif  // SCD_BASE_FINISH_REASON_H_
