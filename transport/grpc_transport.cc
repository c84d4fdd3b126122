// The gRPC backend: one bidirectional `scd.v1.Transfer/Transfer` stream per Link, driven by gRPC's
// callback API (no thread of our own; reactions run on gRPC's threads).
//
// Wire: every gRPC message is one serialized scd.v1.TransferFrame. The backend handles messages as
// raw grpc::ByteBuffers rather than generated protobuf objects so that chunk bytes are never
// copied on the way out (a slice points into the sender's Payload and holds its owner until gRPC
// has written it) and are copied once on the way in (from gRPC's receive slices straight into the
// chunk's buffer). Chunk and piece messages are therefore encoded and decoded by hand around their
// bytes; the small rest (the CodeChunk's other fields, every other frame) goes through protobuf,
// and a plain protobuf peer interoperates.
//
// Writer: gRPC allows one write in flight per stream. When it completes, the next message comes
// from the control queue first, then from the data queue, so a control frame waits for at most
// the one message being written. A chunk whose payload exceeds grpc_max_message_bytes leaves as a
// CodeChunk carrying the first part, then CodeChunkPieces; control messages may go between pieces.
//
// Reader: one read in flight; each message is reassembled and delivered from the gRPC thread that
// completed the read (handlers only queue). A chunk's buffer is a counted Payload from a
// per-transport pool of released chunk buffers (BufferPool). Pieces must follow their chunk
// (control messages may be interleaved); anything else takes the link down with DataLoss.
//
// Closing: the client half-closes (WritesDone) and the server answers by finishing the RPC with
// OK; the server closes by finishing with OK. Either way the peer sees its reads end at once and
// reports Unavailable("peer closed the link"). Waits are bounded: after kGracefulCloseWait the
// call is cancelled.
//
// Throughput (loopback): a fixed 16 MiB HTTP/2 stream window, the buffer pool and raised glibc
// malloc thresholds (RaiseMallocThresholds) each mattered; see the comments there.
#include "transport/grpc_transport.h"

#include "transport/frame_message.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/exception_guard.h"
#include "base/status_macros.h"
#include "proto/scd/v1/transfer.grpc.pb.h"
#include "proto/scd/v1/transfer.pb.h"
#include "spdlog/spdlog.h"

namespace scd::transport {
namespace {

using ::grpc::ByteBuffer;
using ::scd::v1::CodeChunk;
using ::scd::v1::CodeChunkPiece;
using ::scd::v1::TransferFrame;

constexpr char kMethod[] = "/scd.v1.Transfer/Transfer";
// Room for a message's meta beside up to grpc_max_message_bytes of payload (the CodeChunk's other
// fields, scales included, travel in the chunk's first message).
constexpr size_t kMetaAllowance = size_t{1} << 20;
// A peer announcing a larger chunk is treated as malformed rather than trusted with an allocation.
constexpr uint64_t kMaxChunkPayloadBytes = uint64_t{4} << 30;
// Close: how long the graceful end may take before the call is cancelled, then how long the
// cancelled call may take to wind down.
constexpr absl::Duration kGracefulCloseWait = absl::Milliseconds(300);
constexpr absl::Duration kCancelWait = absl::Seconds(2);
// Transport destruction: the server's grace before it cancels what is left.
constexpr absl::Duration kServerShutdownGrace = absl::Milliseconds(250);
// HTTP/2 stream flow-control window (at least; 4 messages when those are larger).
constexpr size_t kStreamWindowBytes = size_t{16} << 20;
// Chunk buffers kept for reuse per transport once their consumers released them.
constexpr size_t kMaxIdlePoolBytes = size_t{256} << 20;

// ---------------------------------------------------------------------------------------------
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
  bool CopyTo(uint8_t* out, size_t n) {
    return Consume(n, [&out](const uint8_t* p, size_t k) {
      std::memcpy(out, p, k);
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

// ---------------------------------------------------------------------------------------------
// Sending side: frames validated into OutFrames, cut into messages by the writer.

struct OutFrame {
  FrameType type = FrameType::kHeartbeat;
  uint64_t session_id = 0;
  // Non-chunk frames: the TransferFrame as the caller serialized it. Chunks: the CodeChunk's fields
  // without payload (the writer wraps them around the payload bytes).
  std::string meta;
  Payload payload;
  bool started = false;  // the chunk's first message is out
  size_t sent = 0;       // payload bytes put into messages so far
};

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
  out.type = frame.type;
  out.session_id = frame.session_id;
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
    out.meta = std::move(frame.meta);
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
  out.meta = chunk->SerializeAsString();
  if (out.meta.size() > kMetaAllowance - 64) {
    return absl::InvalidArgumentError(absl::StrCat("grpc link: chunk meta of ", out.meta.size(),
                                                   " bytes exceeds ", kMetaAllowance - 64));
  }
  out.payload = std::move(frame.payload);
  return out;
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
ByteBuffer ChunkMessage(const OutFrame& frame, size_t n) {
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
ByteBuffer PieceMessage(const OutFrame& frame, size_t offset, size_t n, bool last) {
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

// ---------------------------------------------------------------------------------------------
// Receiving side: messages back into frames.

// Chunk buffers the consumer has released, kept for the next chunks. First-touching fresh memory
// (page faults, 4 KiB at a time) costs more than the copy into it: on the development VM a fresh
// 64 MiB buffer fills at ~300 MB/s, a reused one at ~20 GB/s. Buffers go out as counted
// Payload::Adopt buffers and come back when their last Payload is gone.
class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  explicit BufferPool(size_t max_idle_bytes) : max_idle_bytes_(max_idle_bytes) {}
  ~BufferPool() {
    for (auto& [capacity, data] : idle_) delete[] data;
  }
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // Small buffers come from the allocator, which reuses them well.
  static constexpr size_t kMinPooledBytes = size_t{256} << 10;

  Payload Get(size_t size, uint8_t** writable) {
    if (size < kMinPooledBytes) return Payload::Allocate(size, writable);
    uint8_t* data = nullptr;
    // Sizes rounded up so that chunks of nearly equal size share buffers.
    size_t capacity = (size + kGranule - 1) / kGranule * kGranule;
    {
      absl::MutexLock lock(&mu_);
      // The smallest idle buffer that fits without wasting more than half of it.
      auto it = idle_.lower_bound(capacity);
      if (it != idle_.end() && it->first / 2 <= size) {
        capacity = it->first;
        data = it->second;
        idle_bytes_ -= capacity;
        idle_.erase(it);
      }
    }
    if (data == nullptr) data = new uint8_t[capacity];
    *writable = data;
    std::weak_ptr<BufferPool> pool = weak_from_this();
    return Payload::Adopt(data, size, [pool, data, capacity] {
      if (auto alive = pool.lock()) {
        alive->Put(data, capacity);
      } else {
        delete[] data;
      }
    });
  }

 private:
  static constexpr size_t kGranule = size_t{64} << 10;

  void Put(uint8_t* data, size_t capacity) {
    {
      absl::MutexLock lock(&mu_);
      if (idle_bytes_ + capacity <= max_idle_bytes_) {
        idle_.emplace(capacity, data);
        idle_bytes_ += capacity;
        return;
      }
    }
    delete[] data;
  }

  const size_t max_idle_bytes_;
  absl::Mutex mu_;
  std::multimap<size_t, uint8_t*> idle_ ABSL_GUARDED_BY(mu_);  // capacity -> buffer
  size_t idle_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

// Not thread-safe: used by the link's one reader at a time.
class Reassembler {
 public:
  explicit Reassembler(std::shared_ptr<BufferPool> pool) : pool_(std::move(pool)) {}

  // The frame `message` completes (nullopt while a chunk's pieces are still coming), or why the
  // message is not acceptable.
  absl::StatusOr<std::optional<Frame>> Take(const ByteBuffer& message) {
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

  // Drops a partly received chunk.
  void Reset() { pending_.reset(); }

 private:
  struct Pending {
    Frame frame;
    uint8_t* bytes = nullptr;
    size_t filled = 0;
  };

  static absl::Status Malformed(absl::string_view what) {
    return absl::DataLossError(std::string(what));
  }

  absl::StatusOr<std::optional<Frame>> TakeChunk(uint64_t session_id, SliceReader* body) {
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
    if (total > kMaxChunkPayloadBytes) {
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
    if (total == 0) return std::optional<Frame>(std::move(frame));
    uint8_t* bytes = nullptr;
    frame.payload = pool_->Get(total, &bytes);
    if (payload_size > 0) payload_at->CopyTo(bytes, payload_size);
    if (payload_size == total) return std::optional<Frame>(std::move(frame));
    pending_ = Pending{std::move(frame), bytes, payload_size};
    return std::optional<Frame>();
  }

  absl::StatusOr<std::optional<Frame>> TakePiece(uint64_t session_id, SliceReader* body) {
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
    if (data_size > 0) data_at->CopyTo(pending_->bytes + pending_->filled, data_size);
    pending_->filled += data_size;
    const bool complete = pending_->filled == total;
    if (complete != (last != 0)) {
      return Malformed(absl::StrCat("size mismatch: ", last != 0 ? "last " : "", "piece leaves ",
                                    pending_->filled, " of ", total, " chunk bytes"));
    }
    if (!complete) return std::optional<Frame>();
    Frame frame = std::move(pending_->frame);
    pending_.reset();
    return std::optional<Frame>(std::move(frame));
  }

  absl::StatusOr<std::optional<Frame>> TakeOther(const std::vector<grpc::Slice>& slices) {
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

  std::shared_ptr<BufferPool> pool_;
  std::optional<Pending> pending_;
};

// ---------------------------------------------------------------------------------------------
// Channels must not be destroyed on gRPC's own threads (the last channel releases the callback
// completion queue and joins its threads), so a link that dies there parks its channel here; user
// threads (Connect, transport destruction) empty it.

absl::Mutex graveyard_mu(absl::kConstInit);
std::vector<std::shared_ptr<grpc::Channel>>* graveyard ABSL_GUARDED_BY(graveyard_mu) = nullptr;

void BuryChannel(std::shared_ptr<grpc::Channel> channel) {
  absl::MutexLock lock(&graveyard_mu);
  if (graveyard == nullptr) graveyard = new std::vector<std::shared_ptr<grpc::Channel>>();
  graveyard->push_back(std::move(channel));
}

void EmptyGraveyard() {
  std::vector<std::shared_ptr<grpc::Channel>> dead;
  {
    absl::MutexLock lock(&graveyard_mu);
    if (graveyard != nullptr) dead.swap(*graveyard);
  }
}

// ---------------------------------------------------------------------------------------------
// A link: queues, state and delivery, shared by the public Link object and the stream reactor
// (which outlives the Link until gRPC reports the RPC done).

// What a LinkCore asks of the stream it rides on.
class StreamOps {
 public:
  virtual ~StreamOps() = default;
  // Starts writing `message` (one at a time; it stays untouched until LinkCore::OnWriteDone).
  virtual void Write(const ByteBuffer* message) = 0;
  // Nothing more will be written. `graceful`: the client half-closes; `status`: the server's
  // final status.
  virtual void EndWrites(bool graceful, const grpc::Status& status) = 0;
  virtual void Cancel() = 0;
};

class LinkCore {
 public:
  LinkCore(std::string description, bool is_client, size_t max_message_bytes,
           std::shared_ptr<BufferPool> pool)
      : description_(std::move(description)),
        is_client_(is_client),
        max_message_bytes_(max_message_bytes),
        reassembler_(std::move(pool)) {}

  ~LinkCore() {
    if (channel_ != nullptr) BuryChannel(std::move(channel_));
  }

  LinkCore(const LinkCore&) = delete;
  LinkCore& operator=(const LinkCore&) = delete;

  const std::string& description() const { return description_; }

  // Set up before the link is shared.
  void Attach(StreamOps* stream) {
    stream_ = stream;
    absl::MutexLock lock(&stream_mu_);
    stream_live_ = true;
  }
  void set_channel(std::shared_ptr<grpc::Channel> channel) {
    absl::MutexLock lock(&mu_);
    channel_ = std::move(channel);
  }

  // ---- Link ----

  void Start(LinkHandler* handler) {
    if (handler == nullptr) return;
    absl::MutexLock lock(&deliver_mu_);
    if (handler_ != nullptr) {
      spdlog::warn("{}: Start called twice; keeping the first handler", description_);
      return;
    }
    handler_ = handler;
    DeliveringScope scope(this);
    // One at a time from held_: a handler closing the link meanwhile empties it.
    while (!held_.empty()) {
      Frame frame = std::move(held_.front());
      held_.pop_front();
      CallOnFrame(std::move(frame));
    }
    FlushLinkDownLocked();
  }

  absl::Status Send(Frame frame) {
    absl::StatusOr<OutFrame> out =
        PrepareFrame(std::move(frame), max_message_bytes_ + kMetaAllowance);
    if (!out.ok()) return out.status();
    {
      absl::MutexLock lock(&mu_);
      if (stopped_) {
        return absl::FailedPreconditionError(absl::StrCat(description_, ": link is down"));
      }
      (IsControl(out->type) ? control_q_ : data_q_).push_back(std::move(*out));
    }
    Pump();
    return absl::OkStatus();
  }

  // Stops the link, tells the local handler Cancelled and starts the graceful end; no waiting.
  void BeginClose() {
    // Report first: ending the stream makes gRPC end our reads, which would report the peer.
    ReportDown(absl::CancelledError(absl::StrCat(description_, ": link closed locally")),
               /*drop_held=*/true);
    StopLink(/*graceful=*/true, grpc::Status::OK);
  }

  void Close() {
    BeginClose();
    // Inside this link's own handler call the stream cannot finish until we return.
    if (OnDeliveringThread()) return;
    if (!WaitDone(absl::Now() + kGracefulCloseWait)) {
      Cancel();
      if (!WaitDone(absl::Now() + kCancelWait)) {
        spdlog::warn("{}: stream did not finish {} after cancel", description_,
                     absl::FormatDuration(kCancelWait));
      }
    }
    ReleaseChannel();
  }

  void Cancel() {
    absl::MutexLock lock(&stream_mu_);
    if (stream_live_) stream_->Cancel();
  }

  bool WaitDone(absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithDeadline(absl::Condition(&done_), deadline);
    return done_;
  }

  // Drops the channel (client links) once the stream is over; only from user threads.
  void ReleaseChannel() {
    std::shared_ptr<grpc::Channel> channel;  // destroyed after the lock is released
    absl::MutexLock lock(&mu_);
    if (done_) channel.swap(channel_);
  }

  // Connect: whether the server took the stream (its initial metadata arrived) by `deadline`.
  bool WaitReady(absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    auto decided = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ready_.has_value(); };
    mu_.AwaitWithDeadline(absl::Condition(&decided), deadline);
    return ready_.value_or(false);
  }
  absl::Status final_status() {
    absl::MutexLock lock(&mu_);
    return final_status_;
  }

  // ---- stream reactor side ----

  void OnStreamReady(bool ok) {
    absl::MutexLock lock(&mu_);
    if (!ready_.has_value()) ready_ = ok;
  }

  // One received message. False: stop reading (the link failed).
  bool OnMessage(const ByteBuffer& message) {
    {
      absl::MutexLock lock(&mu_);
      // Closing: keep draining what the peer still sends so it can finish, deliver nothing.
      if (stopped_) return true;
    }
    absl::StatusOr<std::optional<Frame>> frame = reassembler_.Take(message);
    if (!frame.ok()) {
      reassembler_.Reset();
      Fail(absl::DataLossError(absl::StrCat(
          description_, ": malformed stream from the peer: ", frame.status().message())));
      return false;
    }
    if (frame->has_value()) Deliver(std::move(**frame));
    return true;
  }

  // The read side ended (the peer finished or the call failed). `report`: how to tell the
  // handler, when already known.
  void OnReadsEnded(std::optional<absl::Status> report) {
    StopLink(/*graceful=*/false, grpc::Status::OK);
    if (report.has_value()) ReportDown(*std::move(report), /*drop_held=*/false);
  }

  void OnWriteDone(bool ok) {
    ByteBuffer written;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      written.Swap(&write_buf_);
    }
    // Lets go of the payload slices as soon as gRPC has.
    written.Clear();
    if (!ok) {
      // The call is over; its read side ends too and reports why.
      StopLink(/*graceful=*/false, grpc::Status::OK);
      return;
    }
    Pump();
  }

  // Last call from the reactor, after it is gone.
  void OnStreamDone(absl::Status report) {
    StopLink(/*graceful=*/false, grpc::Status::OK);
    ReportDown(report, /*drop_held=*/false);
    reassembler_.Reset();
    {
      absl::MutexLock lock(&stream_mu_);
      stream_live_ = false;
    }
    absl::MutexLock lock(&mu_);
    if (!ready_.has_value()) ready_ = false;
    final_status_ = std::move(report);
    done_ = true;
  }

  // Any failure found on this side (malformed input, an exception in a reaction).
  void Fail(absl::Status status) {
    spdlog::warn("{}", std::string(status.message()));
    const std::string message(status.message());
    ReportDown(std::move(status), /*drop_held=*/true);
    StopLink(/*graceful=*/false, grpc::Status(grpc::StatusCode::INTERNAL, message));
    // The server's final status tells the client; the client must cancel to end the call.
    if (is_client_) Cancel();
  }

 private:
  // Marks the calling thread as the one inside a handler call, for the duration.
  class DeliveringScope {
   public:
    explicit DeliveringScope(LinkCore* core) : core_(core) {
      core_->delivering_.store(std::this_thread::get_id());
    }
    ~DeliveringScope() { core_->delivering_.store(std::thread::id()); }
    DeliveringScope(const DeliveringScope&) = delete;
    DeliveringScope& operator=(const DeliveringScope&) = delete;

   private:
    LinkCore* core_;
  };

  bool OnDeliveringThread() const { return delivering_.load() == std::this_thread::get_id(); }

  // Stops taking frames, drops the queued ones and ends the writes once none is in flight.
  void StopLink(bool graceful, grpc::Status end_status) {
    std::deque<OutFrame> control;
    std::deque<OutFrame> data;
    {
      absl::MutexLock lock(&mu_);
      if (!stopped_) {
        stopped_ = true;
        graceful_ = graceful;
        end_status_ = std::move(end_status);
        control.swap(control_q_);
        data.swap(data_q_);
      }
    }
    Pump();
  }

  // Starts the next write (control first), or ends the writes of a stopped link.
  void Pump() {
    std::optional<OutFrame> finished;  // released outside the lock
    bool write = false;
    bool end_writes = false;
    bool graceful = false;
    grpc::Status end_status;
    {
      absl::MutexLock lock(&mu_);
      if (writing_ || writes_ended_) return;
      if (stopped_) {
        writes_ended_ = true;
        end_writes = true;
        graceful = graceful_;
        end_status = end_status_;
      } else if (NextMessageLocked(&finished)) {
        writing_ = true;
        write = true;
      }
    }
    if (write) stream_->Write(&write_buf_);
    if (end_writes) stream_->EndWrites(graceful, end_status);
  }

  // Puts the next message into write_buf_; a frame whose last message that is moves to `finished`.
  bool NextMessageLocked(std::optional<OutFrame>* finished) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!control_q_.empty()) {
      SetWriteBuffer(OneSliceMessage(control_q_.front().meta));
      finished->emplace(std::move(control_q_.front()));
      control_q_.pop_front();
      return true;
    }
    if (data_q_.empty()) return false;
    OutFrame& frame = data_q_.front();
    const size_t total = frame.payload.size();
    if (frame.type != FrameType::kChunk) {
      SetWriteBuffer(OneSliceMessage(frame.meta));
    } else if (!frame.started) {
      const size_t n = std::min(total, max_message_bytes_);
      SetWriteBuffer(ChunkMessage(frame, n));
      frame.started = true;
      frame.sent = n;
    } else {
      const size_t n = std::min(total - frame.sent, max_message_bytes_);
      SetWriteBuffer(PieceMessage(frame, frame.sent, n, frame.sent + n == total));
      frame.sent += n;
    }
    if (frame.type != FrameType::kChunk || frame.sent == total) {
      finished->emplace(std::move(frame));
      data_q_.pop_front();
    }
    return true;
  }

  void SetWriteBuffer(ByteBuffer message) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    write_buf_.Swap(&message);
  }

  void Deliver(Frame frame) {
    absl::MutexLock lock(&deliver_mu_);
    if (down_.has_value()) return;  // nothing after OnLinkDown
    if (handler_ == nullptr) {
      held_.push_back(std::move(frame));
      return;
    }
    DeliveringScope scope(this);
    CallOnFrame(std::move(frame));
    FlushLinkDownLocked();  // the handler may have closed the link meanwhile
  }

  // Records why the link is down and tells the handler (once). Inside a handler call of this
  // link (a handler closing its own link) the outer delivery tells it after that call returns.
  void ReportDown(absl::Status status, bool drop_held) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (OnDeliveringThread()) {
      RecordDownLocked(std::move(status), drop_held);
      return;
    }
    absl::MutexLock lock(&deliver_mu_);
    RecordDownLocked(std::move(status), drop_held);
    DeliveringScope scope(this);
    FlushLinkDownLocked();
  }

  void RecordDownLocked(absl::Status status, bool drop_held)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(deliver_mu_) {
    if (down_.has_value()) return;
    down_ = std::move(status);
    // A link closed here drops what it held; one the peer closed delivers it at Start first.
    if (drop_held) held_.clear();
  }

  void FlushLinkDownLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(deliver_mu_) {
    if (!down_.has_value() || down_delivered_ || handler_ == nullptr) return;
    down_delivered_ = true;
    try {
      handler_->OnLinkDown(*down_);
    } catch (const std::exception& e) {
      spdlog::error("{}: LinkHandler::OnLinkDown threw: {}", description_, e.what());
    } catch (...) {
      spdlog::error("{}: LinkHandler::OnLinkDown threw", description_);
    }
  }

  void CallOnFrame(Frame frame) ABSL_EXCLUSIVE_LOCKS_REQUIRED(deliver_mu_) {
    try {
      handler_->OnFrame(std::move(frame));
    } catch (const std::exception& e) {
      spdlog::error("{}: LinkHandler::OnFrame threw: {}", description_, e.what());
    } catch (...) {
      spdlog::error("{}: LinkHandler::OnFrame threw", description_);
    }
  }

  const std::string description_;
  const bool is_client_;
  const size_t max_message_bytes_;
  StreamOps* stream_ = nullptr;  // set by Attach; usable while a write or the hold keeps it alive
  Reassembler reassembler_;      // the reader's alone (one read in flight), then OnStreamDone's

  absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;  // Send refuses, queues dropped
  bool graceful_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status end_status_ ABSL_GUARDED_BY(mu_);
  std::deque<OutFrame> control_q_ ABSL_GUARDED_BY(mu_);
  std::deque<OutFrame> data_q_ ABSL_GUARDED_BY(mu_);  // front may be partly written
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool writes_ended_ ABSL_GUARDED_BY(mu_) = false;
  // The message being written; gRPC's from Write until OnWriteDone.
  ByteBuffer write_buf_;
  std::optional<bool> ready_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;  // the reactor is gone
  absl::Status final_status_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<grpc::Channel> channel_ ABSL_GUARDED_BY(mu_);

  // Serializes handler calls; held across them.
  absl::Mutex deliver_mu_;
  LinkHandler* handler_ ABSL_GUARDED_BY(deliver_mu_) = nullptr;
  std::deque<Frame> held_ ABSL_GUARDED_BY(deliver_mu_);  // arrived before Start
  std::optional<absl::Status> down_ ABSL_GUARDED_BY(deliver_mu_);
  bool down_delivered_ ABSL_GUARDED_BY(deliver_mu_) = false;
  std::atomic<std::thread::id> delivering_{};

  // Guards stream_ against the reactor's deletion for Cancel, which may come at any time.
  absl::Mutex stream_mu_;
  bool stream_live_ ABSL_GUARDED_BY(stream_mu_) = false;
};

// Runs a reaction body; an exception takes the link down instead of escaping into gRPC.
template <typename Body>
void React(LinkCore* core, const char* what, Body&& body) {
  try {
    body();
  } catch (const std::exception& e) {
    core->Fail(absl::InternalError(absl::StrCat(core->description(), ": ", what, ": ", e.what())));
  } catch (...) {
    core->Fail(absl::InternalError(absl::StrCat(core->description(), ": ", what, " threw")));
  }
}

// Tells a core its reactor is gone; nothing may escape into gRPC from OnDone.
void FinishCore(LinkCore* core, absl::Status report) {
  try {
    core->OnStreamDone(std::move(report));
  } catch (const std::exception& e) {
    spdlog::error("{}: finishing the stream: {}", core->description(), e.what());
  } catch (...) {
    spdlog::error("{}: finishing the stream failed", core->description());
  }
}

// ---------------------------------------------------------------------------------------------
// Reactors. Each deletes itself in OnDone, after which it tells its core.

class ClientStream final : public grpc::ClientBidiReactor<ByteBuffer, ByteBuffer>,
                           public StreamOps {
 public:
  ClientStream(std::shared_ptr<LinkCore> core, grpc::GenericStub* stub) : core_(std::move(core)) {
    stub->PrepareBidiStreamingCall(&context_, kMethod, grpc::StubOptions(), this);
    // Send() starts writes from outside reactions; the hold keeps the call until EndWrites.
    AddHold();
    core_->Attach(this);
    StartRead(&read_buf_);
    StartCall();
  }

  void Write(const ByteBuffer* message) override { StartWrite(message); }
  void EndWrites(bool graceful, const grpc::Status&) override {
    if (graceful) StartWritesDone();
    RemoveHold();
  }
  void Cancel() override { context_.TryCancel(); }

  void OnReadInitialMetadataDone(bool ok) override { core_->OnStreamReady(ok); }
  void OnReadDone(bool ok) override {
    React(core_.get(), "read", [&] {
      if (ok && core_->OnMessage(read_buf_)) {
        read_buf_.Clear();
        StartRead(&read_buf_);
        return;
      }
      read_buf_.Clear();
      // The status, and so what to report, arrives with OnDone.
      if (!ok) core_->OnReadsEnded(std::nullopt);
    });
  }
  void OnWriteDone(bool ok) override {
    React(core_.get(), "write", [&] { core_->OnWriteDone(ok); });
  }
  void OnDone(const grpc::Status& status) override {
    std::shared_ptr<LinkCore> core = std::move(core_);
    const grpc::StatusCode code = status.error_code();
    absl::Status report = absl::UnavailableError("peer closed the link");
    try {
      if (code == grpc::StatusCode::CANCELLED) {
        report = absl::UnavailableError(
            absl::StrCat(core->description(), ": peer closed the link (stream cancelled)"));
      } else if (code != grpc::StatusCode::OK) {
        report = absl::UnavailableError(absl::StrCat(core->description(), ": grpc stream failed (",
                                                     code, "): ", status.error_message()));
      } else {
        report =
            absl::UnavailableError(absl::StrCat(core->description(), ": peer closed the link"));
      }
    } catch (...) {
      // Keep the short report.
    }
    delete this;
    FinishCore(core.get(), std::move(report));
  }

 private:
  grpc::ClientContext context_;
  ByteBuffer read_buf_;
  std::shared_ptr<LinkCore> core_;
};

class ServerStream final : public grpc::ServerBidiReactor<ByteBuffer, ByteBuffer>,
                           public StreamOps {
 public:
  ServerStream(grpc::CallbackServerContext* context, std::shared_ptr<LinkCore> core)
      : context_(context), core_(std::move(core)) {
    core_->Attach(this);
    // Lets the client's Connect return once the listener has taken the stream.
    StartSendInitialMetadata();
    StartRead(&read_buf_);
  }

  void Write(const ByteBuffer* message) override { StartWrite(message); }
  void EndWrites(bool, const grpc::Status& status) override { Finish(status); }
  void Cancel() override { context_->TryCancel(); }

  void OnReadDone(bool ok) override {
    React(core_.get(), "read", [&] {
      if (ok && core_->OnMessage(read_buf_)) {
        read_buf_.Clear();
        StartRead(&read_buf_);
        return;
      }
      read_buf_.Clear();
      if (!ok) core_->OnReadsEnded(PeerGone());
    });
  }
  void OnWriteDone(bool ok) override {
    React(core_.get(), "write", [&] { core_->OnWriteDone(ok); });
  }
  void OnCancel() override {
    React(core_.get(), "cancel", [&] { core_->OnReadsEnded(PeerGone()); });
  }
  void OnDone() override {
    std::shared_ptr<LinkCore> core = std::move(core_);
    delete this;
    FinishCore(core.get(), absl::UnavailableError("stream finished"));
  }

 private:
  absl::Status PeerGone() const {
    if (context_->IsCancelled()) {
      return absl::UnavailableError(
          absl::StrCat(core_->description(),
                       ": stream cancelled (peer closed the link or the connection failed)"));
    }
    return absl::UnavailableError(absl::StrCat(core_->description(), ": peer closed the link"));
  }

  grpc::CallbackServerContext* context_;
  ByteBuffer read_buf_;
  std::shared_ptr<LinkCore> core_;
};

// Refuses a stream (the listener is closed).
class RejectStream final : public grpc::ServerBidiReactor<ByteBuffer, ByteBuffer> {
 public:
  explicit RejectStream(grpc::Status status) { Finish(std::move(status)); }
  void OnDone() override { delete this; }
};

// ---------------------------------------------------------------------------------------------
// Links, listeners, the transport.

class GrpcLink final : public Link {
 public:
  explicit GrpcLink(std::shared_ptr<LinkCore> core) : core_(std::move(core)) {}
  ~GrpcLink() override { Close(); }

  void Start(LinkHandler* handler) override { core_->Start(handler); }
  absl::Status Send(Frame frame) override {
    return GuardExceptions("grpc Link::Send", [&] { return core_->Send(std::move(frame)); });
  }
  void Close() override {
    absl::Status status = GuardExceptions("grpc Link::Close", [&] {
      core_->Close();
      return absl::OkStatus();
    });
    if (!status.ok()) spdlog::error("{}", std::string(status.message()));
  }
  std::string Describe() const override { return core_->description(); }

 private:
  std::shared_ptr<LinkCore> core_;
};

// Begins closing every link, then waits for all of them within one graceful period, cancelling
// the stragglers.
void CloseAll(const std::vector<std::shared_ptr<LinkCore>>& links) {
  for (const auto& link : links) link->BeginClose();
  const absl::Time graceful = absl::Now() + kGracefulCloseWait;
  for (const auto& link : links) {
    if (!link->WaitDone(graceful)) link->Cancel();
  }
  const absl::Time hard = absl::Now() + kCancelWait;
  for (const auto& link : links) {
    if (!link->WaitDone(hard)) {
      spdlog::warn("{}: stream did not finish after cancel", link->description());
    }
    link->ReleaseChannel();
  }
}

struct HostPort {
  std::string host;
  int port = 0;
};

absl::StatusOr<HostPort> SplitHostPort(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = -1;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(absl::string_view(address).substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("grpc: address '", address, "' is not host:port"));
  }
  return HostPort{address.substr(0, colon), port};
}

int ClampToInt(int64_t value) { return static_cast<int>(std::clamp<int64_t>(value, 1, INT_MAX)); }

// Channel arguments both ends share.
std::vector<std::pair<std::string, int>> CommonArgs(const TransportOptions& options) {
  const int interval = ClampToInt(absl::ToInt64Milliseconds(options.grpc_keepalive_interval));
  const int timeout = ClampToInt(absl::ToInt64Milliseconds(options.grpc_keepalive_timeout));
  // HTTP/2 stream window. gRPC's default (64 KiB, grown by BDP probing) keeps a bulk stream
  // waiting for WINDOW_UPDATEs: on loopback a fixed large window more than doubled goodput and
  // halved CPU per byte. It bounds what a receiver buffers per link.
  const int window = ClampToInt(
      static_cast<int64_t>(std::max(kStreamWindowBytes, 4 * options.grpc_max_message_bytes)));
  return {
      // Keepalive: a peer that stops answering pings is declared dead after interval + timeout,
      // also on idle links and between messages.
      {GRPC_ARG_KEEPALIVE_TIME_MS, interval},
      {GRPC_ARG_KEEPALIVE_TIMEOUT_MS, timeout},
      {GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1},
      {GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0},
      {GRPC_ARG_HTTP2_MIN_SENT_PING_INTERVAL_WITHOUT_DATA_MS, interval},
      {GRPC_ARG_HTTP2_BDP_PROBE, 0},
      {GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, window},
  };
}

int MessageLimit(const TransportOptions& options) {
  return ClampToInt(static_cast<int64_t>(options.grpc_max_message_bytes + kMetaAllowance + 1024));
}

class ServerState;

using TransferServiceBase =
    scd::v1::Transfer::WithRawCallbackMethod_Transfer<scd::v1::Transfer::Service>;

class TransferService final : public TransferServiceBase {
 public:
  explicit TransferService(ServerState* owner) : owner_(owner) {}
  using TransferServiceBase::Transfer;
  grpc::ServerBidiReactor<ByteBuffer, ByteBuffer>* Transfer(
      grpc::CallbackServerContext* context) override;

 private:
  ServerState* owner_;
};

// One grpc::Server and the links it accepted. Lives until the transport is destroyed (closing the
// Listener only stops accepting), since shutting the server down would cancel accepted links.
class ServerState {
 public:
  ServerState(const TransportOptions& options, std::shared_ptr<BufferPool> pool)
      : options_(options), pool_(std::move(pool)), service_(this) {}
  ~ServerState() { Shutdown(); }

  absl::Status Start(const std::string& address, const HostPort& host_port) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    for (const auto& [name, value] : CommonArgs(options_)) builder.AddChannelArgument(name, value);
    const int interval =
        ClampToInt(absl::ToInt64Milliseconds(options_.grpc_keepalive_interval) / 2);
    // The clients ping every keepalive interval; the server must not count that as abuse.
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, interval);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
    // Linux gRPC sets SO_REUSEPORT by default: a second Listen on a busy port would succeed.
    builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    builder.SetMaxReceiveMessageSize(MessageLimit(options_));
    builder.SetMaxSendMessageSize(MessageLimit(options_));
    server_ = builder.BuildAndStart();
    if (server_ == nullptr || port == 0) {
      server_.reset();
      return absl::UnavailableError(
          absl::StrCat("grpc: cannot listen on ", address, " (in use or not a local address)"));
    }
    address_ = absl::StrCat(host_port.host, ":", port);
    spdlog::debug("grpc: listening on {}", address_);
    return absl::OkStatus();
  }

  const std::string& address() const { return address_; }

  grpc::ServerBidiReactor<ByteBuffer, ByteBuffer>* OnIncoming(
      grpc::CallbackServerContext* context) {
    absl::MutexLock lock(&mu_);
    if (!accepting_) {
      return new RejectStream(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                           absl::StrCat("listener ", address_, " is closed")));
    }
    auto core =
        std::make_shared<LinkCore>(absl::StrCat("grpc ", address_, " <- ", context->peer()),
                                   /*is_client=*/false, options_.grpc_max_message_bytes, pool_);
    auto* stream = new ServerStream(context, core);
    links_.erase(std::remove_if(links_.begin(), links_.end(),
                                [](const std::weak_ptr<LinkCore>& l) { return l.expired(); }),
                 links_.end());
    links_.push_back(core);
    pending_.push_back(std::move(core));
    return stream;
  }

  absl::StatusOr<std::shared_ptr<LinkCore>> Accept(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !pending_.empty() || !accepting_;
    };
    mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
    if (!accepting_) return absl::CancelledError(absl::StrCat("listener ", address_, " closed"));
    if (pending_.empty()) {
      return absl::DeadlineExceededError(
          absl::StrCat("no link arrived at ", address_, " within ", absl::FormatDuration(timeout)));
    }
    std::shared_ptr<LinkCore> core = std::move(pending_.front());
    pending_.pop_front();
    return core;
  }

  // Refuses further streams and closes the ones not yet accepted.
  void CloseAccepting() {
    std::vector<std::shared_ptr<LinkCore>> unaccepted;
    {
      absl::MutexLock lock(&mu_);
      accepting_ = false;
      unaccepted.assign(pending_.begin(), pending_.end());
      pending_.clear();
    }
    CloseAll(unaccepted);
  }

  void AppendLinks(std::vector<std::shared_ptr<LinkCore>>* out) {
    absl::MutexLock lock(&mu_);
    for (const auto& weak : links_) {
      if (auto link = weak.lock()) out->push_back(std::move(link));
    }
  }

  // Stops the server; its links should be closed first (what is left is cancelled).
  void Shutdown() {
    if (server_ == nullptr) return;
    server_->Shutdown(absl::ToChronoTime(absl::Now() + kServerShutdownGrace));
    server_.reset();
  }

 private:
  const TransportOptions options_;
  const std::shared_ptr<BufferPool> pool_;
  std::string address_;
  absl::Mutex mu_;
  bool accepting_ ABSL_GUARDED_BY(mu_) = true;
  std::deque<std::shared_ptr<LinkCore>> pending_ ABSL_GUARDED_BY(mu_);
  std::vector<std::weak_ptr<LinkCore>> links_ ABSL_GUARDED_BY(mu_);
  TransferService service_;               // outlives server_
  std::unique_ptr<grpc::Server> server_;  // set by Start, reset by Shutdown (user threads)
};

grpc::ServerBidiReactor<ByteBuffer, ByteBuffer>* TransferService::Transfer(
    grpc::CallbackServerContext* context) {
  try {
    return owner_->OnIncoming(context);
  } catch (const std::exception& e) {
    spdlog::error("grpc: taking an incoming stream failed: {}", e.what());
  } catch (...) {
    spdlog::error("grpc: taking an incoming stream failed");
  }
  return new RejectStream(grpc::Status(grpc::StatusCode::INTERNAL, "cannot take the stream"));
}

class GrpcListener final : public Listener {
 public:
  explicit GrpcListener(std::shared_ptr<ServerState> server) : server_(std::move(server)) {}
  ~GrpcListener() override { Close(); }

  absl::StatusOr<std::unique_ptr<Link>> Accept(absl::Duration timeout) override {
    return GuardExceptions("grpc Listener::Accept", [&]() -> absl::StatusOr<std::unique_ptr<Link>> {
      SCD_ASSIGN_OR_RETURN(std::shared_ptr<LinkCore> core, server_->Accept(timeout));
      return std::make_unique<GrpcLink>(std::move(core));
    });
  }
  std::string address() const override { return server_->address(); }
  void Close() override {
    absl::Status status = GuardExceptions("grpc Listener::Close", [&] {
      server_->CloseAccepting();
      return absl::OkStatus();
    });
    if (!status.ok()) spdlog::error("{}", std::string(status.message()));
  }

 private:
  std::shared_ptr<ServerState> server_;
};

class GrpcTransport final : public Transport {
 public:
  explicit GrpcTransport(const TransportOptions& options) : options_(options) {
    capabilities_.backend = "grpc";
    capabilities_.cross_process = true;
    capabilities_.zero_copy_send = false;
    capabilities_.rdma = false;
    capabilities_.gpu_memory = false;
    capabilities_.max_message_bytes = options.grpc_max_message_bytes;
    capabilities_.devices = {"tcp"};
  }

  ~GrpcTransport() override {
    try {
      Shutdown();
    } catch (const std::exception& e) {
      spdlog::error("grpc transport shutdown: {}", e.what());
    } catch (...) {
      spdlog::error("grpc transport shutdown failed");
    }
  }

  const Capabilities& capabilities() const override { return capabilities_; }

  absl::StatusOr<std::unique_ptr<Listener>> Listen(const std::string& address) override {
    return GuardExceptions("grpc Listen", [&]() -> absl::StatusOr<std::unique_ptr<Listener>> {
      SCD_ASSIGN_OR_RETURN(HostPort host_port, SplitHostPort(address));
      auto server = std::make_shared<ServerState>(options_, pool_);
      SCD_RETURN_IF_ERROR(server->Start(address, host_port));
      absl::MutexLock lock(&mu_);
      servers_.push_back(server);
      return std::make_unique<GrpcListener>(std::move(server));
    });
  }

  absl::StatusOr<std::unique_ptr<Link>> Connect(const std::string& address,
                                                absl::Duration timeout) override {
    return GuardExceptions("grpc Connect", [&]() -> absl::StatusOr<std::unique_ptr<Link>> {
      return DoConnect(address, timeout);
    });
  }

 private:
  absl::StatusOr<std::unique_ptr<Link>> DoConnect(const std::string& address,
                                                  absl::Duration timeout) {
    SCD_ASSIGN_OR_RETURN(HostPort host_port, SplitHostPort(address));
    if (host_port.port == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("grpc: cannot connect to port 0 (", address, ")"));
    }
    EmptyGraveyard();
    const absl::Time deadline = absl::Now() + timeout;
    std::shared_ptr<grpc::Channel> channel =
        grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), ChannelArgs());
    if (!channel->WaitForConnected(absl::ToChronoTime(deadline))) {
      return absl::UnavailableError(absl::StrCat("grpc: cannot connect to ", address, " within ",
                                                 absl::FormatDuration(timeout)));
    }
    auto core =
        std::make_shared<LinkCore>(absl::StrCat("grpc ", address, " (client)"),
                                   /*is_client=*/true, options_.grpc_max_message_bytes, pool_);
    core->set_channel(channel);
    {
      grpc::GenericStub stub(channel);
      new ClientStream(core, &stub);  // deletes itself when the call is over
    }
    channel.reset();
    if (!core->WaitReady(deadline)) {
      core->Close();
      absl::Status why = core->final_status();
      return absl::UnavailableError(
          absl::StrCat("grpc: ", address, " did not take the link within ",
                       absl::FormatDuration(timeout), why.ok() ? "" : ": ", why.message()));
    }
    {
      absl::MutexLock lock(&mu_);
      clients_.erase(std::remove_if(clients_.begin(), clients_.end(),
                                    [](const std::weak_ptr<LinkCore>& l) { return l.expired(); }),
                     clients_.end());
      clients_.push_back(core);
    }
    spdlog::debug("{}: connected", core->description());
    return std::make_unique<GrpcLink>(std::move(core));
  }

  grpc::ChannelArguments ChannelArgs() const {
    grpc::ChannelArguments args;
    for (const auto& [name, value] : CommonArgs(options_)) args.SetInt(name, value);
    // Each link gets a TCP connection of its own (gRPC would share one between equal channels).
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    // Retries would buffer sent messages for replay; a link never replays.
    args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
    // A listener that comes up during Connect's timeout is found quickly.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    args.SetMaxReceiveMessageSize(MessageLimit(options_));
    args.SetMaxSendMessageSize(MessageLimit(options_));
    return args;
  }

  // Closes every link (client and accepted) together, then stops the servers.
  void Shutdown() {
    std::vector<std::shared_ptr<LinkCore>> links;
    std::vector<std::shared_ptr<ServerState>> servers;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& weak : clients_) {
        if (auto link = weak.lock()) links.push_back(std::move(link));
      }
      clients_.clear();
      servers.swap(servers_);
    }
    for (const auto& server : servers) {
      server->CloseAccepting();
      server->AppendLinks(&links);
    }
    CloseAll(links);
    for (const auto& server : servers) server->Shutdown();
    EmptyGraveyard();
  }

  const TransportOptions options_;
  Capabilities capabilities_;
  const std::shared_ptr<BufferPool> pool_ = std::make_shared<BufferPool>(kMaxIdlePoolBytes);
  absl::Mutex mu_;
  std::vector<std::weak_ptr<LinkCore>> clients_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<ServerState>> servers_ ABSL_GUARDED_BY(mu_);
};

// glibc trims an arena's free top back to the kernel once it exceeds M_TRIM_THRESHOLD, 128 KiB
// until the process first frees a large mmapped block, when glibc raises that threshold (and the
// mmap threshold) to fit the block. Until then gRPC's 64 KiB read buffers are handed back and
// faulted in again on nearly every read; on the development VM those page faults and the TLB
// shootdowns of the trims cost more than all the copying (300 MB/s instead of 3.5 GB/s for
// 4 MiB chunks). Freeing one 32 MiB block applies glibc's own adjustment up front (mmap threshold
// 32 MiB, trim threshold 64 MiB). Process-wide, once; a process that set these thresholds itself
// (mallopt, MALLOC_*_ env) keeps its settings, since glibc then stops adjusting them.
void RaiseMallocThresholds() {
#if defined(__GLIBC__)
  static std::once_flag once;
  std::call_once(once, [] {
    // Just under glibc's 32 MiB cap for the adjustment (DEFAULT_MMAP_THRESHOLD_MAX).
    void* block = std::malloc((size_t{32} << 20) - (size_t{64} << 10));
    // Keeps the compiler from eliding the pair.
    asm volatile("" : : "r"(block) : "memory");
    std::free(block);
  });
#endif
}

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> NewGrpcTransport(const TransportOptions& options) {
  if (options.grpc_max_message_bytes == 0 ||
      options.grpc_max_message_bytes > static_cast<size_t>(INT_MAX) - 2 * kMetaAllowance) {
    return absl::InvalidArgumentError(absl::StrCat("grpc: grpc_max_message_bytes ",
                                                   options.grpc_max_message_bytes,
                                                   " is outside 1 .. 2 GiB - 2 MiB"));
  }
  if (options.grpc_keepalive_interval <= absl::ZeroDuration() ||
      options.grpc_keepalive_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("grpc: keepalive interval and timeout must be positive");
  }
  return GuardExceptions("NewGrpcTransport", [&]() -> absl::StatusOr<std::unique_ptr<Transport>> {
    RaiseMallocThresholds();
    return std::make_unique<GrpcTransport>(options);
  });
}

}  // namespace scd::transport
