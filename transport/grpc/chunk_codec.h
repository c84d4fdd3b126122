// The gRPC backend's wire encoding of frames, without any server: every gRPC message is one
// serialized scd.v1.TransferFrame, handled as a raw grpc::ByteBuffer so that chunk bytes are never
// copied on the way out (a slice points into the sender's Payload and holds its owner until gRPC
// has written it) and are copied once on the way in (from gRPC's receive slices straight into the
// chunk's buffer). Chunk and piece messages are therefore encoded and decoded by hand around their
// bytes; the small rest (the CodeChunk's other fields, every other frame) goes through protobuf,
// and a plain protobuf peer interoperates.
//
// A chunk whose payload exceeds the message limit leaves as a CodeChunk carrying the first part,
// then CodeChunkPieces (control messages may go between them); the Reassembler puts it back
// together into a ReceivePool buffer, taking the payload's CRC-32C in the same pass as that copy
// (Frame::payload_crc). Anything else inside a chunk's pieces is malformed.
// Thread-safety: plain values and functions; a Reassembler is used by one reader at a time.
#ifndef SCD_TRANSPORT_GRPC_CHUNK_CODEC_H_
#define SCD_TRANSPORT_GRPC_CHUNK_CODEC_H_

#include <grpcpp/support/byte_buffer.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "transport/frame.h"
#include "transport/receive_pool.h"

namespace scd::transport::grpc_internal {

// Room for a message's meta beside up to the limit of payload (the CodeChunk's other fields,
// scales included, travel in the chunk's first message).
constexpr size_t kMetaAllowance = size_t{1} << 20;

// A frame on its way out: validated, its meta ready for the messages it becomes. For chunks
// `frame.meta` holds the CodeChunk's fields without payload (the messages wrap them around the
// payload bytes); for every other frame, the TransferFrame as the caller serialized it.
struct OutFrame {
  Frame frame;
  bool started = false;  // the chunk's first message is out
  size_t sent = 0;       // payload bytes put into messages so far
  bool done() const { return started && sent == frame.payload.size(); }
};

// InvalidArgument for a frame the link cannot carry (meta that is no TransferFrame of the frame's
// type and session, a payload on a non-chunk frame, meta above the limit).
absl::StatusOr<OutFrame> PrepareFrame(Frame frame, size_t message_limit);

// The next message of `frame` (at most `max_message_bytes` of payload); `frame->done()` after its
// last one. Control frames and headers/trailers are one message.
grpc::ByteBuffer NextMessage(OutFrame* frame, size_t max_message_bytes);

class SliceReader;  // reads one message held in several slices (chunk_codec.cc)

class Reassembler {
 public:
  explicit Reassembler(std::shared_ptr<ReceivePool> pool) : pool_(std::move(pool)) {}
  // The frame `message` completes (nullopt while a chunk's pieces are still coming), or DataLoss
  // saying why the message is not acceptable.
  absl::StatusOr<std::optional<Frame>> Take(const grpc::ByteBuffer& message);
  // Drops a partly received chunk.
  void Reset() { pending_.reset(); }

 private:
  struct Pending {
    Frame frame;
    uint8_t* bytes = nullptr;
    size_t filled = 0;
    uint32_t crc = 0;  // CRC-32C of the bytes filled so far
  };
  absl::StatusOr<std::optional<Frame>> TakeChunk(uint64_t session_id, SliceReader* body);
  absl::StatusOr<std::optional<Frame>> TakePiece(uint64_t session_id, SliceReader* body);
  absl::StatusOr<std::optional<Frame>> TakeOther(const std::vector<grpc::Slice>& slices);

  std::shared_ptr<ReceivePool> pool_;
  std::optional<Pending> pending_;
};

}  // namespace scd::transport::grpc_internal

#endif  // SCD_TRANSPORT_GRPC_CHUNK_CODEC_H_
