// Framing of the codec's code chunks into scd.v1 transfer messages, and back: the one place that
// maps codec/ types to proto/ messages. A framed chunk's payload is a view of the chunk's own data
// tensor (no copy; `owner` keeps it alive); scales (small) travel in the message. Unframing checks
// every field as codec/code_batch_wire does (AssembleCodeChunk), so a consumer never sees a chunk
// that does not match its dtype and shape.
// Thread-safety: stateless functions.
#ifndef SCD_PROTO_CODE_CHUNK_FRAMING_H_
#define SCD_PROTO_CODE_CHUNK_FRAMING_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "codec/code_batch.h"
#include "codec/code_encoder.h"
#include "proto/session_tag.h"
#include "scd/v1/transfer.pb.h"

namespace scd {

struct FramedChunk {
  v1::CodeChunk meta;  // payload empty; payload_bytes and scales set (crc32c: the transport's)
  const uint8_t* data = nullptr;
  size_t size = 0;
  std::shared_ptr<const void> owner;  // holds the contiguous CPU data tensor `data` points into
};

// Who sends, for whom; goes into the header.
struct TransferIdentity {
  std::string request_id;
  std::string producer_fingerprint;
  std::string consumer_fingerprint;
  std::string artifact_id;
};

// The header announcing `batch`: mode, tokens, per-layer ranks and dtypes, expected bytes and
// chunks. `layers` is the producer model's layer count.
v1::TransferHeader FrameHeader(const CodeBatch& batch, int layers,
                               const TransferIdentity& identity);
// The same header before any chunk exists (a streaming producer sends it first), from the chunks
// the encoder plans (CodeEncoder::PlannedChunks). Equal to the batch's header for that batch.
v1::TransferHeader FrameHeader(TransferMode mode, int64_t tokens, int layers,
                               const std::vector<PlannedChunk>& chunks,
                               const TransferIdentity& identity);
FramedChunk FrameChunk(const CodeChunk& chunk);

// Back to codec types. InvalidArgument for enum values this build does not know and for fields
// that do not match the bytes.
absl::StatusOr<TransferMode> ModeFromProto(v1::Mode mode);
absl::StatusOr<CodeChunk> UnframeChunk(const v1::CodeChunk& meta, absl::string_view payload,
                                       int64_t batch_tokens);

}  // namespace scd

#endif  // SCD_PROTO_CODE_CHUNK_FRAMING_H_
