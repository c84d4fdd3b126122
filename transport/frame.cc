#include "transport/frame.h"

namespace scd::transport {

const char* FrameTypeName(FrameType type) {
  switch (type) {
    case FrameType::kHeader: return "header";
    case FrameType::kChunk: return "chunk";
    case FrameType::kTrailer: return "trailer";
    case FrameType::kAck: return "ack";
    case FrameType::kError: return "error";
    case FrameType::kCredit: return "credit";
    case FrameType::kCancel: return "cancel";
    case FrameType::kHeartbeat: return "heartbeat";
  }
  return "unknown";
}

}  // namespace scd::transport
