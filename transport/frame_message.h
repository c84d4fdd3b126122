// The one mapping between a Frame's type and the scd.v1.TransferFrame its meta carries, shared by
// the session layer (which builds and checks frames) and the gRPC backend (which must turn frames
// into messages and back).
// Thread-safety: stateless functions.
#ifndef SCD_TRANSPORT_FRAME_MESSAGE_H_
#define SCD_TRANSPORT_FRAME_MESSAGE_H_

#include <optional>

#include "absl/status/statusor.h"
#include "scd/v1/transfer.pb.h"
#include "transport/frame.h"

namespace scd::transport {

// The frame type a message body travels as; nullopt for a piece (internal to the gRPC backend) and
// for a message without a body.
std::optional<FrameType> FrameTypeOf(v1::TransferFrame::BodyCase body);

// A frame carrying `message` (and `payload`, for chunks): type and session id from the message.
// InvalidArgument for a message FrameTypeOf has no type for.
absl::StatusOr<Frame> FrameFromMessage(const v1::TransferFrame& message,
                                       Payload payload = Payload());

}  // namespace scd::transport

#endif  // SCD_TRANSPORT_FRAME_MESSAGE_H_
