// CodeBatch: one request's transfer payload, the unit a producer encodes and a consumer rebuilds
// its cache from. It is a list of CodeChunks, each one tensor of one kind for one layer and token
// range, held in its wire representation so that byte counts are exact.
// Thread-safety: plain value types.
#ifndef SCD_CODEC_CODE_BATCH_H_
#define SCD_CODEC_CODE_BATCH_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "codec/transfer_mode.h"
#include "codec/wire_dtype.h"

namespace scd {

enum class PayloadKind {
  kKeyCode,      // reuse code of pre-RoPE keys      [kv_heads, T, r_K] ([1, T, r_K] folded)
  kValueCode,    // reuse code of values             [kv_heads, T, r_V] ([1, T, r_V] folded)
  kHiddenCode,   // patch code of the attention input [T, r_H]
  kRawKey,       // pre-RoPE keys                    [kv_heads, T, head_dim]
  kRawValue,     // values                           [kv_heads, T, head_dim]
  kHiddenState,  // residual stream entering a recomputed segment [T, hidden]
};

std::string PayloadKindName(PayloadKind kind);
// Whether `kind` is a nested code (key, value or hidden code), whose rank may be cut.
bool IsCodeKind(PayloadKind kind);

struct CodeChunk {
  int layer = 0;
  PayloadKind kind = PayloadKind::kKeyCode;
  int64_t token_begin = 0, token_end = 0;
  WireDtype dtype = WireDtype::kF16;
  std::vector<int64_t> shape;  // logical shape of the decoded tensor
  at::Tensor data;             // wire values: float, int8, or uint8 (packed int4)
  at::Tensor scales;  // int8: f16 [rows]; int4: f16 [groups, 2] (scale, zero); else undefined

  // Bytes on the wire: data plus scales.
  int64_t bytes() const;
};

struct CodeBatch {
  TransferMode mode = TransferMode::kLocal;
  int64_t tokens = 0;  // prefix positions covered
  std::vector<CodeChunk> chunks;

  int64_t bytes() const;
  std::map<int, int64_t> BytesPerLayer() const;
  double BytesPerToken() const { return tokens > 0 ? static_cast<double>(bytes()) / tokens : 0.0; }
};

// Data and scale byte counts a chunk of `dtype` and logical `shape` carries (the layout table in
// codec/code_batch_wire.h). InvalidArgument for an empty shape, a dimension < 1 or more than
// 2^40 elements.
struct ChunkByteCounts {
  int64_t elements = 0, data = 0, scales = 0;
};
absl::StatusOr<ChunkByteCounts> ExpectedChunkBytes(WireDtype dtype,
                                                   const std::vector<int64_t>& shape);
// Whether the chunk's tensors are what its dtype and shape say (element types and byte counts).
absl::Status CheckChunkTensors(const CodeChunk& chunk);

// Wire encoding of one float tensor (any shape) and back. Unpacking checks the chunk first
// (CheckChunkTensors) and returns float32 on `device`.
CodeChunk PackTensor(const at::Tensor& values, WireDtype dtype);
absl::StatusOr<at::Tensor> UnpackTensor(const CodeChunk& chunk, c10::Device device);

}  // namespace scd

#endif  // SCD_CODEC_CODE_BATCH_H_
