#include "base/finish_reason.h"

namespace scd {

std::string_view FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return "";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kMaxPositions:
      return "max_positions";
    case FinishReason::kCancelled:
      return "cancelled";
  }
  return "";
}

FinishReason ParseFinishReason(std::string_view name) {
  for (FinishReason reason : {FinishReason::kStop, FinishReason::kLength,
                              FinishReason::kMaxPositions, FinishReason::kCancelled}) {
    if (FinishReasonName(reason) == name) return reason;
  }
  return FinishReason::kNone;
}

}  // namespace scd
