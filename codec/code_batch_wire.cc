#include "codec/code_batch_wire.h"

#include <ATen/ATen.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/crc32c.h"
#include "base/fuzzing.h"
#include "base/exception_guard.h"
#include "base/status_macros.h"

namespace scd {
namespace {

constexpr char kBatchMagic[4] = {'S', 'C', 'D', 'B'};
constexpr char kChunkMagic[4] = {'S', 'C', 'D', 'C'};
constexpr size_t kBatchHeaderBytes = 24;
constexpr size_t kChunkFixedBytes = 28;  // up to the shape
constexpr int kPayloadKinds = 6;         // PayloadKind values 0..5
constexpr int kWireDtypes = 5;           // WireDtype values 0..4
constexpr int kTransferModes = 6;        // TransferMode values 0..5

// Little-endian appends and reads (the hosts we build for are little-endian; memcpy keeps the
// reads alignment-safe).
template <typename T>
void Put(std::string* out, T value) {
  static_assert(std::is_trivially_copyable_v<T>);
  out->append(reinterpret_cast<const char*>(&value), sizeof(T));
}

template <typename T>
T Get(const char* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

void PutTensor(std::string* out, const at::Tensor& t) {
  if (!t.defined()) return;
  at::Tensor c = t.to(at::kCPU).contiguous();
  out->append(static_cast<const char*>(c.data_ptr()), c.numel() * c.element_size());
}

at::Tensor TensorFrom(const char* p, std::vector<int64_t> sizes, at::ScalarType type) {
  at::Tensor t = at::empty(sizes, at::TensorOptions().dtype(type));
  std::memcpy(t.data_ptr(), p, t.numel() * t.element_size());
  return t;
}

// The data and scale tensors a chunk of this dtype and shape holds (PackTensor's layout).
void AttachTensors(const char* data, const char* scales, const ChunkByteCounts& bytes,
                   CodeChunk* chunk) {
  switch (chunk->dtype) {
    case WireDtype::kF32:
      chunk->data = TensorFrom(data, chunk->shape, at::kFloat);
      break;
    case WireDtype::kF16:
      chunk->data = TensorFrom(data, chunk->shape, at::kHalf);
      break;
    case WireDtype::kBF16:
      chunk->data = TensorFrom(data, chunk->shape, at::kBFloat16);
      break;
    case WireDtype::kInt8:
      chunk->data = TensorFrom(data, chunk->shape, at::kChar);
      chunk->scales = TensorFrom(scales, {bytes.scales / 2}, at::kHalf);
      break;
    case WireDtype::kInt4:
      chunk->data = TensorFrom(data, {bytes.data}, at::kByte);
      chunk->scales = TensorFrom(scales, {bytes.scales / 4, 2}, at::kHalf);
      break;
  }
}

absl::Status Truncated(int index, const char* what) {
  return absl::DataLossError(
      absl::StrCat("code batch is truncated: chunk ", index, " ends inside its ", what));
}

// Header fields of one chunk record, checked; `*offset` moves past the shape.
absl::Status ParseChunkHeader(absl::string_view bytes, int64_t batch_tokens, int index,
                              size_t* offset, CodeChunk* chunk) {
  const std::string at = absl::StrCat("chunk ", index, ": ");
  if (bytes.size() < kChunkFixedBytes) return Truncated(index, "header");
  const char* p = bytes.data();
  if (std::memcmp(p, kChunkMagic, 4) != 0) {
    return absl::DataLossError(absl::StrCat(at, "bad magic (not a code chunk record)"));
  }
  chunk->layer = Get<int32_t>(p + 4);
  const uint8_t kind = Get<uint8_t>(p + 8), dtype = Get<uint8_t>(p + 9),
                rank = Get<uint8_t>(p + 10);
  chunk->token_begin = Get<int64_t>(p + 12);
  chunk->token_end = Get<int64_t>(p + 20);
  if (kind >= kPayloadKinds)
    return absl::InvalidArgumentError(absl::StrCat(at, "unknown kind ", kind));
  if (dtype >= kWireDtypes) {
    return absl::InvalidArgumentError(absl::StrCat(at, "unknown wire dtype ", dtype));
  }
  if (rank < 1 || rank > kMaxChunkRank) {
    return absl::InvalidArgumentError(absl::StrCat(at, "shape rank ", rank, " is not 1..8"));
  }
  if (chunk->layer < 0) return absl::InvalidArgumentError(absl::StrCat(at, "layer ", chunk->layer));
  if (chunk->token_begin < 0 || chunk->token_begin >= chunk->token_end ||
      chunk->token_end > batch_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(at, "token range [", chunk->token_begin, ", ",
                                                   chunk->token_end, ") is not inside the batch's ",
                                                   batch_tokens, " tokens"));
  }
  chunk->kind = static_cast<PayloadKind>(kind);
  chunk->dtype = static_cast<WireDtype>(dtype);
  *offset = kChunkFixedBytes;
  if (bytes.size() < *offset + 8 * rank) return Truncated(index, "shape");
  chunk->shape.clear();
  for (int i = 0; i < rank; ++i) chunk->shape.push_back(Get<int64_t>(p + *offset + 8 * i));
  *offset += 8 * rank;
  return absl::OkStatus();
}

}  // namespace

std::string SerializeCodeChunk(const CodeChunk& chunk) {
  std::string out;
  out.append(kChunkMagic, 4);
  Put<int32_t>(&out, chunk.layer);
  Put<uint8_t>(&out, static_cast<uint8_t>(chunk.kind));
  Put<uint8_t>(&out, static_cast<uint8_t>(chunk.dtype));
  Put<uint8_t>(&out, static_cast<uint8_t>(chunk.shape.size()));
  Put<uint8_t>(&out, 0);
  Put<int64_t>(&out, chunk.token_begin);
  Put<int64_t>(&out, chunk.token_end);
  for (int64_t d : chunk.shape) Put<int64_t>(&out, d);
  const int64_t data = chunk.data.defined() ? chunk.data.numel() * chunk.data.element_size() : 0;
  const int64_t scales =
      chunk.scales.defined() ? chunk.scales.numel() * chunk.scales.element_size() : 0;
  Put<uint64_t>(&out, static_cast<uint64_t>(data));
  Put<uint64_t>(&out, static_cast<uint64_t>(scales));
  PutTensor(&out, chunk.data);
  PutTensor(&out, chunk.scales);
  Put<uint32_t>(&out, Crc32c(out.data(), out.size()));
  return out;
}

absl::StatusOr<CodeChunk> ParseCodeChunk(absl::string_view* bytes, int64_t batch_tokens,
                                         int index) {
  CodeChunk chunk;
  size_t offset = 0;
  SCD_RETURN_IF_ERROR(ParseChunkHeader(*bytes, batch_tokens, index, &offset, &chunk));
  const std::string at = absl::StrCat("chunk ", index, " (layer ", chunk.layer, " ",
                                      PayloadKindName(chunk.kind), "): ");
  absl::StatusOr<ChunkByteCounts> want = ExpectedChunkBytes(chunk.dtype, chunk.shape);
  if (!want.ok()) return absl::InvalidArgumentError(at + std::string(want.status().message()));
  if (bytes->size() < offset + 16) return Truncated(index, "byte counts");
  const uint64_t data = Get<uint64_t>(bytes->data() + offset);
  const uint64_t scales = Get<uint64_t>(bytes->data() + offset + 8);
  offset += 16;
  if (data != static_cast<uint64_t>(want->data) || scales != static_cast<uint64_t>(want->scales)) {
    return absl::InvalidArgumentError(
        absl::StrCat(at, "carries ", data, " data and ", scales, " scale bytes but a ",
                     WireDtypeName(chunk.dtype), " tensor of this shape has ", want->data, " and ",
                     want->scales));
  }
  if (bytes->size() < offset + data + scales + 4) return Truncated(index, "payload");
  const size_t covered = offset + data + scales;
  if (kChecksumsChecked &&
      Get<uint32_t>(bytes->data() + covered) != Crc32c(bytes->data(), covered)) {
    return absl::DataLossError(at + "checksum mismatch (corrupted in transit)");
  }
  SCD_RETURN_IF_ERROR(GuardExceptions("ParseCodeChunk", [&]() -> absl::Status {
    AttachTensors(bytes->data() + offset, bytes->data() + offset + data, *want, &chunk);
    return absl::OkStatus();
  }));
  bytes->remove_prefix(covered + 4);
  return chunk;
}

absl::StatusOr<CodeChunk> AssembleCodeChunk(const CodeChunk& fields, absl::string_view data,
                                            absl::string_view scales, int64_t batch_tokens,
                                            int index) {
  CodeChunk chunk;
  chunk.layer = fields.layer;
  chunk.kind = fields.kind;
  chunk.dtype = fields.dtype;
  chunk.token_begin = fields.token_begin;
  chunk.token_end = fields.token_end;
  chunk.shape = fields.shape;
  const std::string at = absl::StrCat("chunk ", index, " (layer ", chunk.layer, " ",
                                      PayloadKindName(chunk.kind), "): ");
  if (chunk.layer < 0) return absl::InvalidArgumentError(absl::StrCat(at, "negative layer"));
  if (chunk.token_begin < 0 || chunk.token_begin >= chunk.token_end ||
      chunk.token_end > batch_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(at, "token range [", chunk.token_begin, ", ",
                                                   chunk.token_end, ") is not inside the batch's ",
                                                   batch_tokens, " tokens"));
  }
  if (chunk.shape.empty() || chunk.shape.size() > static_cast<size_t>(kMaxChunkRank)) {
    return absl::InvalidArgumentError(
        absl::StrCat(at, "shape rank ", chunk.shape.size(), " is not 1..8"));
  }
  absl::StatusOr<ChunkByteCounts> want = ExpectedChunkBytes(chunk.dtype, chunk.shape);
  if (!want.ok()) return absl::InvalidArgumentError(at + std::string(want.status().message()));
  if (data.size() != static_cast<uint64_t>(want->data) ||
      scales.size() != static_cast<uint64_t>(want->scales)) {
    return absl::InvalidArgumentError(
        absl::StrCat(at, "carries ", data.size(), " data and ", scales.size(),
                     " scale bytes but a ", WireDtypeName(chunk.dtype),
                     " tensor of this shape has ", want->data, " and ", want->scales));
  }
  SCD_RETURN_IF_ERROR(GuardExceptions("AssembleCodeChunk", [&]() -> absl::Status {
    AttachTensors(data.data(), scales.data(), *want, &chunk);
    return absl::OkStatus();
  }));
  return chunk;
}

std::string SerializeCodeBatch(const CodeBatch& batch) {
  std::string out;
  out.append(kBatchMagic, 4);
  Put<uint16_t>(&out, kCodeBatchWireVersion);
  Put<uint8_t>(&out, static_cast<uint8_t>(batch.mode));
  Put<uint8_t>(&out, 0);
  Put<int64_t>(&out, batch.tokens);
  Put<uint32_t>(&out, static_cast<uint32_t>(batch.chunks.size()));
  Put<uint32_t>(&out, Crc32c(out.data(), out.size()));
  for (const CodeChunk& chunk : batch.chunks) out += SerializeCodeChunk(chunk);
  return out;
}

absl::StatusOr<CodeBatch> ParseCodeBatch(absl::string_view bytes) {
  if (bytes.size() < kBatchHeaderBytes) {
    return absl::DataLossError(absl::StrCat("code batch is truncated: ", bytes.size(),
                                            " bytes, the header alone is ", kBatchHeaderBytes));
  }
  const char* p = bytes.data();
  if (std::memcmp(p, kBatchMagic, 4) != 0) {
    return absl::DataLossError("not a code batch (bad magic)");
  }
  if (kChecksumsChecked && Get<uint32_t>(p + 20) != Crc32c(p, 20)) {
    return absl::DataLossError("code batch header checksum mismatch (corrupted in transit)");
  }
  const uint16_t version = Get<uint16_t>(p + 4);
  if (version != kCodeBatchWireVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("code batch wire format version ", version,
                     " is not supported (this build reads version ", kCodeBatchWireVersion, ")"));
  }
  const uint8_t mode = Get<uint8_t>(p + 6);
  if (mode >= kTransferModes) {
    return absl::InvalidArgumentError(absl::StrCat("code batch has unknown transfer mode ", mode));
  }
  CodeBatch batch;
  batch.mode = static_cast<TransferMode>(mode);
  batch.tokens = Get<int64_t>(p + 8);
  if (batch.tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("code batch covers ", batch.tokens, " tokens"));
  }
  const uint32_t count = Get<uint32_t>(p + 16);
  bytes.remove_prefix(kBatchHeaderBytes);
  for (uint32_t i = 0; i < count; ++i) {
    if (bytes.empty()) {
      return absl::DataLossError(
          absl::StrCat("code batch is truncated: it declares ", count, " chunks and holds ", i));
    }
    SCD_ASSIGN_OR_RETURN(CodeChunk chunk,
                         ParseCodeChunk(&bytes, batch.tokens, static_cast<int>(i)));
    batch.chunks.push_back(std::move(chunk));
  }
  if (!bytes.empty()) {
    return absl::DataLossError(absl::StrCat("code batch has ", bytes.size(), " bytes after its ",
                                            count, " declared chunks"));
  }
  return batch;
}

}  // namespace scd
