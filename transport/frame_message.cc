#include "transport/frame_message.h"

namespace scd::transport {

std::optional<FrameType> FrameTypeOf(v1::TransferFrame::BodyCase body) {
  switch (body) {
    case v1::TransferFrame::kHeader: return FrameType::kHeader;
    case v1::TransferFrame::kChunk: return FrameType::kChunk;
    case v1::TransferFrame::kTrailer: return FrameType::kTrailer;
    case v1::TransferFrame::kAck: return FrameType::kAck;
    case v1::TransferFrame::kError: return FrameType::kError;
    case v1::TransferFrame::kCredit: return FrameType::kCredit;
    case v1::TransferFrame::kCancel: return FrameType::kCancel;
    case v1::TransferFrame::kHeartbeat: return FrameType::kHeartbeat;
    case v1::TransferFrame::kPiece:
    case v1::TransferFrame::BODY_NOT_SET: break;
  }
  return std::nullopt;
}

absl::StatusOr<Frame> FrameFromMessage(const v1::TransferFrame& message, Payload payload) {
  const std::optional<FrameType> type = FrameTypeOf(message.body_case());
  if (!type.has_value()) {
    return absl::InvalidArgumentError("a TransferFrame without a frame body (piece or empty)");
  }
  Frame frame;
  frame.type = *type;
  frame.session_id = message.session_id();
  frame.meta = message.SerializeAsString();
  frame.payload = std::move(payload);
  return frame;
}

}  // namespace scd::transport
