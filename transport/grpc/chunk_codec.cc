// Chunk and piece messages are written and read field by field (protobuf wire format) around their
// payload bytes; everything else is plain protobuf.
#include "transport/grpc/chunk_codec.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/crc32c.h"
#include "scd/v1/transfer.pb.h"
#include "transport/frame_message.h"

namespace scd::transport::grpc_internal {

using ::grpc::ByteBuffer;
using ::scd::v1::CodeChunk;
using ::scd::v1::CodeChunkPiece;
using ::scd::v1::TransferFrame;

namespace {

// Protobuf wire format, for the messages encoded and decoded by hand.

constexpr uint32_t kVarintWire = 0;
constexpr uint32_t kFixed64Wire = 1;
constexpr uint32_t kLenWire = 2;
constexpr uint32_t kFixed32Wire = 5;

void AppendVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

size_t VarintSize(uint64_t value) {
  size_t n = 1;
  while (value >= 0x80) {
    value >>= 7;
    ++n;
  }
  return n;
}

uint64_t Tag(int field, uint32_t wire_type) {
  return (static_cast<uint64_t>(field) << 3) | wire_type;
}

void AppendTag(int field, uint32_t wire_type, std::string* out) {
  AppendVarint(Tag(field, wire_type), out);
}

absl::Status Malformed(absl::string_view what) { return absl::DataLossError(std::string(what)); }

}  // namespace

// Reads one message held in several slices without flattening it. Reads never pass the limit
// (the end of the field being parsed); a copy of a reader remembers a position.
class SliceReader {
 public:
  explicit SliceReader(const std::vector<grpc::Slice>* slices) : slices_(slices) {
    for (const grpc::Slice& slice : *slices) limit_ += slice.size();
  }

  size_t remaining() const { return limit_ - position_; }
  bool at_end() const { return position_ == limit_; }
  // Confines reads to the next `n` bytes; false when fewer are left.
  bool Limit(size_t n) {
    if (n > remaining()) return false;
    limit_ = position_ + n;
    return true;
  }

  bool ReadVarint(uint64_t* value) {
    uint64_t result = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t byte = 0;
      if (!Consume(1, [&byte](const uint8_t* p, size_t) { byte = *p; })) return false;
      result |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) {
        *value = result;
        return true;
      }
    }
    return false;
  }
  bool Skip(size_t n) {
    return Consume(n, [](const uint8_t*, size_t) {});
  }
  // Copies the next `n` bytes to `out`, extending `*crc` with them in the same pass.
  bool CopyTo(uint8_t* out, size_t n, uint32_t* crc) {
    return Consume(n, [&out, crc](const uint8_t* p, size_t k) {
      *crc = Crc32cCopy(out, p, k, *crc);
      out += k;
    });
  }
  bool AppendTo(size_t n, std::string* out) {
    return Consume(
        n, [out](const uint8_t* p, size_t k) { out->append(reinterpret_cast<const char*>(p), k); });
  }

 private:
  template <typename Sink>
  bool Consume(size_t n, Sink&& sink) {
    if (n > remaining()) return false;
    position_ += n;
    while (n > 0) {
      const grpc::Slice& slice = (*slices_)[index_];
      const size_t take = std::min(n, slice.size() - offset_);
      if (take > 0) sink(slice.begin() + offset_, take);
      offset_ += take;
      n -= take;
      if (offset_ == slice.size()) {
        ++index_;
        offset_ = 0;
      }
    }
    return true;
  }

  const std::vector<grpc::Slice>* slices_;
  size_t index_ = 0;   // current slice
  size_t offset_ = 0;  // within it
  size_t position_ = 0;
  size_t limit_ = 0;
};

namespace {

// Reads the value of a field whose tag was just read; with `copy`, appends tag and value to it (to
// rebuild a message without some of its fields).
bool PassField(uint64_t tag, SliceReader* reader, std::string* copy) {
  if (copy != nullptr) AppendVarint(tag, copy);
  uint64_t value = 0;
  switch (tag & 7) {
    case kVarintWire:
      if (!reader->ReadVarint(&value)) return false;
      if (copy != nullptr) AppendVarint(value, copy);
      return true;
    case kFixed64Wire:
      return copy != nullptr ? reader->AppendTo(8, copy) : reader->Skip(8);
    case kFixed32Wire:
      return copy != nullptr ? reader->AppendTo(4, copy) : reader->Skip(4);
    case kLenWire:
      if (!reader->ReadVarint(&value) || value > reader->remaining()) return false;
      if (copy != nullptr) AppendVarint(value, copy);
      return copy != nullptr ? reader->AppendTo(value, copy) : reader->Skip(value);
    default:  // groups are not part of this protocol
      return false;
  }
}

// A slice over payload bytes, holding its own reference to the payload's owner so that the bytes
// live exactly as long as gRPC needs them.
grpc::Slice PayloadSlice(const Payload& payload, size_t offset, size_t n) {
  auto* keep = new Payload(payload);
  return grpc::Slice(
      const_cast<uint8_t*>(payload.data()) + offset, n,
      [](void* p) { delete static_cast<Payload*>(p); }, keep);
}

ByteBuffer OneSliceMessage(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return ByteBuffer(&slice, 1);
}

ByteBuffer TwoSliceMessage(const std::string& head, const Payload& payload, size_t offset,
                           size_t n) {
  grpc::Slice slices[2] = {grpc::Slice(head), PayloadSlice(payload, offset, n)};
  return ByteBuffer(slices, 2);
}

void AppendSessionId(uint64_t session_id, std::string* out) {
  if (session_id == 0) return;  // proto3 default
  AppendTag(TransferFrame::kSessionIdFieldNumber, kVarintWire, out);
  AppendVarint(session_id, out);
}

// TransferFrame{session_id, chunk{<meta fields>, payload = payload[0, n)}}.
ByteBuffer ChunkMessage(const Frame& frame, size_t n) {
  const uint64_t payload_tag = Tag(CodeChunk::kPayloadFieldNumber, kLenWire);
  const size_t payload_field = n == 0 ? 0 : VarintSize(payload_tag) + VarintSize(n) + n;
  std::string head;
  head.reserve(frame.meta.size() + 32);
  AppendSessionId(frame.session_id, &head);
  AppendTag(TransferFrame::kChunkFieldNumber, kLenWire, &head);
  AppendVarint(frame.meta.size() + payload_field, &head);
  head += frame.meta;
  if (n == 0) return OneSliceMessage(head);
  AppendVarint(payload_tag, &head);
  AppendVarint(n, &head);
  return TwoSliceMessage(head, frame.payload, 0, n);
}

// TransferFrame{session_id, piece{last, data = payload[offset, offset + n)}}.
ByteBuffer PieceMessage(const Frame& frame, size_t offset, size_t n, bool last) {
  const uint64_t last_tag = Tag(CodeChunkPiece::kLastFieldNumber, kVarintWire);
  const uint64_t data_tag = Tag(CodeChunkPiece::kDataFieldNumber, kLenWire);
  const size_t piece_size =
      (last ? VarintSize(last_tag) + 1 : 0) + VarintSize(data_tag) + VarintSize(n) + n;
  std::string head;
  AppendSessionId(frame.session_id, &head);
  AppendTag(TransferFrame::kPieceFieldNumber, kLenWire, &head);
  AppendVarint(piece_size, &head);
  if (last) {
    AppendVarint(last_tag, &head);
    AppendVarint(1, &head);
  }
  AppendVarint(data_tag, &head);
  AppendVarint(n, &head);
  return TwoSliceMessage(head, frame.payload, offset, n);
}

}  // namespace

absl::StatusOr<OutFrame> PrepareFrame(Frame frame, size_t message_limit) {
  TransferFrame meta;
  if (!meta.ParseFromString(frame.meta)) {
    return absl::InvalidArgumentError(absl::StrCat("grpc link: frame meta (", frame.meta.size(),
                                                   " bytes) is not a serialized TransferFrame"));
  }
  const std::optional<FrameType> type = FrameTypeOf(meta.body_case());
  if (!type.has_value()) {
    return absl::InvalidArgumentError("grpc link: frame meta has no sendable TransferFrame body");
  }
  if (*type != frame.type) {
    return absl::InvalidArgumentError(absl::StrCat("grpc link: frame type ",
                                                   FrameTypeName(frame.type),
                                                   " but meta carries a ", FrameTypeName(*type)));
  }
  if (meta.session_id() != frame.session_id) {
    return absl::InvalidArgumentError(absl::StrCat("grpc link: frame session ", frame.session_id,
                                                   " but meta says ", meta.session_id()));
  }
  OutFrame out;
  out.frame.type = frame.type;
  out.frame.session_id = frame.session_id;
  if (frame.type != FrameType::kChunk) {
    if (!frame.payload.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("grpc link: a ", FrameTypeName(frame.type), " frame carries no payload"));
    }
    if (frame.meta.size() > message_limit) {
      return absl::InvalidArgumentError(absl::StrCat("grpc link: frame meta of ", frame.meta.size(),
                                                     " bytes exceeds the ", message_limit,
                                                     "-byte message limit"));
    }
    out.frame.meta = std::move(frame.meta);
    return out;
  }
  CodeChunk* chunk = meta.mutable_chunk();
  if (!chunk->payload().empty()) {
    return absl::InvalidArgumentError(
        "grpc link: chunk meta carries payload bytes; they belong in Frame::payload");
  }
  if (chunk->payload_bytes() != frame.payload.size()) {
    return absl::InvalidArgumentError(absl::StrCat("grpc link: chunk says payload_bytes ",
                                                   chunk->payload_bytes(), " but the payload has ",
                                                   frame.payload.size()));
  }
  out.frame.meta = chunk->SerializeAsString();
  if (out.frame.meta.size() > kMetaAllowance - 64) {
    return absl::InvalidArgumentError(absl::StrCat("grpc link: chunk meta of ",
                                                   out.frame.meta.size(), " bytes exceeds ",
                                                   kMetaAllowance - 64));
  }
  out.frame.payload = std::move(frame.payload);
  return out;
}

ByteBuffer NextMessage(OutFrame* out, size_t max_message_bytes) {
  const Frame& frame = out->frame;
  const size_t total = frame.payload.size();
  if (frame.type != FrameType::kChunk) {
    out->started = true;
    return OneSliceMessage(frame.meta);
  }
  if (!out->started) {
    const size_t n = std::min(total, max_message_bytes);
    out->started = true;
    out->sent = n;
    return ChunkMessage(frame, n);
  }
  const size_t n = std::min(total - out->sent, max_message_bytes);
  ByteBuffer message = PieceMessage(frame, out->sent, n, out->sent + n == total);
  out->sent += n;
  return message;
}

absl::StatusOr<std::optional<Frame>> Reassembler::Take(const ByteBuffer& message) {
  std::vector<grpc::Slice> slices;
  if (!message.Dump(&slices).ok()) return Malformed("unreadable message");
  SliceReader reader(&slices);
  uint64_t session_id = 0;
  int body_field = 0;
  int body_count = 0;
  std::optional<SliceReader> body;
  uint64_t body_size = 0;
  while (!reader.at_end()) {
    uint64_t tag = 0;
    if (!reader.ReadVarint(&tag)) return Malformed("truncated TransferFrame");
    const int field = static_cast<int>(tag >> 3);
    if (field == TransferFrame::kSessionIdFieldNumber && (tag & 7) == kVarintWire) {
      if (!reader.ReadVarint(&session_id)) return Malformed("truncated session id");
    } else if (field == TransferFrame::kChunkFieldNumber ||
               field == TransferFrame::kPieceFieldNumber) {
      if ((tag & 7) != kLenWire) return Malformed("chunk or piece is not a message");
      if (!reader.ReadVarint(&body_size) || body_size > reader.remaining()) {
        return Malformed("truncated TransferFrame body");
      }
      body = reader;
      body_field = field;
      ++body_count;
      reader.Skip(body_size);
    } else {
      if (!PassField(tag, &reader, nullptr)) return Malformed("truncated TransferFrame field");
      if (field >= TransferFrame::kHeaderFieldNumber &&
          field <= TransferFrame::kHeartbeatFieldNumber) {
        body_field = field;
        ++body_count;
      }
    }
  }
  if (body_field == TransferFrame::kChunkFieldNumber ||
      body_field == TransferFrame::kPieceFieldNumber) {
    if (body_count != 1) {
      return Malformed("a chunk or piece shares its message with another body");
    }
    body->Limit(body_size);
    if (body_field == TransferFrame::kChunkFieldNumber) return TakeChunk(session_id, &*body);
    return TakePiece(session_id, &*body);
  }
  return TakeOther(slices);
}

absl::StatusOr<std::optional<Frame>> Reassembler::TakeChunk(uint64_t session_id,
                                                            SliceReader* body) {
  if (pending_.has_value()) {
    return Malformed(absl::StrCat("chunk while the previous chunk still expects ",
                                  pending_->frame.payload.size() - pending_->filled, " bytes"));
  }
  std::string fields;  // the CodeChunk without its payload
  std::optional<SliceReader> payload_at;
  uint64_t payload_size = 0;
  while (!body->at_end()) {
    uint64_t tag = 0;
    if (!body->ReadVarint(&tag)) return Malformed("truncated CodeChunk");
    if (tag == Tag(CodeChunk::kPayloadFieldNumber, kLenWire)) {
      if (!body->ReadVarint(&payload_size) || payload_size > body->remaining()) {
        return Malformed("truncated chunk payload");
      }
      payload_at = *body;
      body->Skip(payload_size);
    } else if (!PassField(tag, body, &fields)) {
      return Malformed("truncated CodeChunk field");
    }
  }
  TransferFrame meta;
  meta.set_session_id(session_id);
  CodeChunk* chunk = meta.mutable_chunk();
  if (!chunk->ParseFromString(fields)) return Malformed("unparsable CodeChunk");
  const uint64_t total = chunk->payload_bytes();
  if (total > kMaxFramePayloadBytes) {
    return Malformed(absl::StrCat("chunk announces ", total, " payload bytes"));
  }
  if (payload_size > total) {
    return Malformed(absl::StrCat("size mismatch: chunk carries ", payload_size,
                                  " bytes but announces ", total));
  }
  Frame frame;
  frame.type = FrameType::kChunk;
  frame.session_id = session_id;
  frame.meta = meta.SerializeAsString();
  if (total == 0) {
    frame.payload_crc = 0;  // of no bytes
    return std::optional<Frame>(std::move(frame));
  }
  uint8_t* bytes = nullptr;
  frame.payload = pool_->Get(total, &bytes);
  // The one copy out of gRPC's slices also takes the payload's checksum (the session's CRC pass).
  uint32_t crc = 0;
  if (payload_size > 0) payload_at->CopyTo(bytes, payload_size, &crc);
  if (payload_size == total) {
    frame.payload_crc = crc;
    return std::optional<Frame>(std::move(frame));
  }
  pending_ = Pending{std::move(frame), bytes, payload_size, crc};
  return std::optional<Frame>();
}

absl::StatusOr<std::optional<Frame>> Reassembler::TakePiece(uint64_t session_id,
                                                            SliceReader* body) {
  if (!pending_.has_value()) return Malformed("piece without a chunk");
  if (session_id != pending_->frame.session_id) {
    return Malformed(absl::StrCat("piece for session ", session_id, " inside a chunk of session ",
                                  pending_->frame.session_id));
  }
  std::optional<SliceReader> data_at;
  uint64_t data_size = 0;
  uint64_t last = 0;
  while (!body->at_end()) {
    uint64_t tag = 0;
    if (!body->ReadVarint(&tag)) return Malformed("truncated CodeChunkPiece");
    if (tag == Tag(CodeChunkPiece::kDataFieldNumber, kLenWire)) {
      if (!body->ReadVarint(&data_size) || data_size > body->remaining()) {
        return Malformed("truncated piece data");
      }
      data_at = *body;
      body->Skip(data_size);
    } else if (tag == Tag(CodeChunkPiece::kLastFieldNumber, kVarintWire)) {
      if (!body->ReadVarint(&last)) return Malformed("truncated piece flag");
    } else if (!PassField(tag, body, nullptr)) {
      return Malformed("truncated CodeChunkPiece field");
    }
  }
  const size_t total = pending_->frame.payload.size();
  if (data_size > total - pending_->filled) {
    return Malformed(absl::StrCat("size mismatch: piece of ", data_size, " bytes after ",
                                  pending_->filled, " of ", total));
  }
  if (data_size > 0) data_at->CopyTo(pending_->bytes + pending_->filled, data_size, &pending_->crc);
  pending_->filled += data_size;
  const bool complete = pending_->filled == total;
  if (complete != (last != 0)) {
    return Malformed(absl::StrCat("size mismatch: ", last != 0 ? "last " : "", "piece leaves ",
                                  pending_->filled, " of ", total, " chunk bytes"));
  }
  if (!complete) return std::optional<Frame>();
  Frame frame = std::move(pending_->frame);
  frame.payload_crc = pending_->crc;
  pending_.reset();
  return std::optional<Frame>(std::move(frame));
}

absl::StatusOr<std::optional<Frame>> Reassembler::TakeOther(
    const std::vector<grpc::Slice>& slices) {
  std::string bytes;
  size_t size = 0;
  for (const grpc::Slice& slice : slices) size += slice.size();
  bytes.reserve(size);
  for (const grpc::Slice& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  TransferFrame meta;
  if (!meta.ParseFromString(bytes)) return Malformed("unparsable TransferFrame");
  const std::optional<FrameType> type = FrameTypeOf(meta.body_case());
  if (!type.has_value()) return Malformed("TransferFrame without a body");
  if (!IsControl(*type) && pending_.has_value()) {
    return Malformed(absl::StrCat(FrameTypeName(*type), " while a chunk still expects ",
                                  pending_->frame.payload.size() - pending_->filled, " bytes"));
  }
  Frame frame;
  frame.type = *type;
  frame.session_id = meta.session_id();
  frame.meta = std::move(bytes);
  return std::optional<Frame>(std::move(frame));
}

}  // namespace scd::transport::grpc_internal
