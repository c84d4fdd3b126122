// The checked wire form of a CodeBatch: what a producer puts on a transport and a consumer
// accepts. Parse checks every field against every other (kinds, dtypes, shapes, byte counts,
// token ranges, checksums) and refuses anything else with a status naming the chunk and field;
// a parsed batch is bit-identical to the one serialized.
//
// Layout, little-endian, no padding:
//   batch header (24 bytes)
//     0  char[4]  magic "SCDB"
//     4  u16      format version (kCodeBatchWireVersion)
//     6  u8       TransferMode
//     7  u8       reserved, 0
//     8  i64      tokens: prefix positions the batch covers
//    16  u32      chunk count
//    20  u32      CRC-32C of bytes 0..19
//   then `chunk count` chunk records, each one SerializeCodeChunk():
//     0  char[4]  magic "SCDC"
//     4  i32      layer
//     8  u8       PayloadKind
//     9  u8       WireDtype
//    10  u8       rank R of the logical shape (1..8)
//    11  u8       reserved, 0
//    12  i64      token_begin
//    20  i64      token_end
//    28  i64[R]   logical shape (the decoded tensor's)
//        u64      data bytes D   (must equal what dtype and shape imply, below)
//        u64      scale bytes S  (likewise)
//        u8[D]    data:   f32 4n | f16, bf16 2n | int8 n | int4 ceil(n/2) (low nibble first)
//        u8[S]    scales: none for floats | int8: f16 per row (n / last dim rows) | int4: f16
//                 (scale, zero) per group of 32 values
//        u32      CRC-32C of everything above in this record
// Thread-safety: stateless functions.
#ifndef SCD_CODEC_CODE_BATCH_WIRE_H_
#define SCD_CODEC_CODE_BATCH_WIRE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "codec/code_batch.h"

namespace scd {

inline constexpr uint16_t kCodeBatchWireVersion = 1;
inline constexpr int kMaxChunkRank = 8;

std::string SerializeCodeBatch(const CodeBatch& batch);
absl::StatusOr<CodeBatch> ParseCodeBatch(absl::string_view bytes);

// One chunk record (what a transport frames on its own).
std::string SerializeCodeChunk(const CodeChunk& chunk);
// Parses one record from the front of `*bytes` and advances past it. `batch_tokens` bounds the
// token range; `index` names the chunk in errors.
absl::StatusOr<CodeChunk> ParseCodeChunk(absl::string_view* bytes, int64_t batch_tokens, int index);

// A chunk from metadata read elsewhere (a transport's message: `fields` has layer, kind, dtype,
// token range and shape; its tensors are ignored) and its data and scale bytes, checked as
// ParseCodeChunk checks a record (layer, token range inside `batch_tokens`, rank, byte counts
// against dtype and shape) and copied into the chunk's tensors. `index` names the chunk in errors.
absl::StatusOr<CodeChunk> AssembleCodeChunk(const CodeChunk& fields, absl::string_view data,
                                            absl::string_view scales, int64_t batch_tokens,
                                            int index);

}  // namespace scd

#endif  // SCD_CODEC_CODE_BATCH_WIRE_H_
