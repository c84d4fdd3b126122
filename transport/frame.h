// Frame: the unit every transport backend moves. `meta` is a serialized scd.v1.TransferFrame
// (proto/scd/v1/transfer.proto) without chunk payload bytes; `payload` is the chunk's bulk bytes,
// carried beside it so that backends can move them without copying (in-process) or out of band (UCX
// rendezvous). Backends never parse `meta`, except gRPC, which must put the bytes into messages.
//
// Two lanes: data frames (header, chunk, trailer) arrive in the order they were sent on a link;
// control frames (ack, error, credit, cancel, heartbeat) never wait behind queued data frames and
// may overtake them.
// Thread-safety: plain value types.
#ifndef SCD_TRANSPORT_FRAME_H_
#define SCD_TRANSPORT_FRAME_H_

#include <cstdint>
#include <optional>
#include <string>

#include "transport/payload.h"

namespace scd::transport {

enum class FrameType : uint8_t {
  kHeader = 1,
  kChunk = 2,
  kTrailer = 3,
  kAck = 4,
  kError = 5,
  kCredit = 6,
  kCancel = 7,
  kHeartbeat = 8,
};
constexpr uint8_t kMaxFrameType = 8;
// The largest payload a peer may announce for one frame. Every backend refuses a larger one (the
// link goes down with DataLoss) before it allocates anything for it.
constexpr uint64_t kMaxFramePayloadBytes = uint64_t{4} << 30;

inline bool IsControl(FrameType type) { return static_cast<uint8_t>(type) >= 4; }
const char* FrameTypeName(FrameType type);

struct Frame {
  FrameType type = FrameType::kHeartbeat;
  uint64_t session_id = 0;  // 0: the link itself
  std::string meta;         // serialized scd.v1.TransferFrame
  Payload payload;          // chunk bytes (kChunk only)
  // CRC-32C of `payload`, when the receiving backend computed it as the bytes landed (in the same
  // pass as the copy it made anyway, or right after a zero-copy receive while they were hot), so
  // the session layer need not read them again. Never sent; a fault injector that alters the
  // payload clears it.
  std::optional<uint32_t> payload_crc;

  // Bytes this frame puts on the wire (meta + payload), for shaping and accounting.
  size_t wire_bytes() const { return meta.size() + payload.size(); }
};

}  // namespace scd::transport

#endif  // SCD_TRANSPORT_FRAME_H_
