#include "proto/code_chunk_framing.h"

#include <ATen/ATen.h>

#include <map>

#include "absl/strings/str_cat.h"
#include "codec/code_batch_wire.h"

namespace scd {
namespace {

// The proto enums mirror the codec's with the same numbers (checked here once).
static_assert(static_cast<int>(TransferMode::kScd) == v1::MODE_SCD);
static_assert(static_cast<int>(TransferMode::kRecompute) == v1::MODE_RECOMPUTE);
static_assert(static_cast<int>(TransferMode::kReuse) == v1::MODE_REUSE);
static_assert(static_cast<int>(PayloadKind::kHiddenState) == v1::KIND_HIDDEN_STATE);
static_assert(static_cast<int>(WireDtype::kInt4) == v1::DTYPE_INT4);

std::string TensorBytes(const at::Tensor& t) {
  if (!t.defined()) return "";
  at::Tensor c = t.to(at::kCPU).contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), c.numel() * c.element_size());
}

}  // namespace

v1::TransferHeader FrameHeader(TransferMode mode, int64_t tokens, int layers,
                               const std::vector<PlannedChunk>& chunks,
                               const TransferIdentity& identity) {
  v1::TransferHeader header;
  header.set_request_id(identity.request_id);
  header.set_producer_fingerprint(identity.producer_fingerprint);
  header.set_consumer_fingerprint(identity.consumer_fingerprint);
  header.set_artifact_id(identity.artifact_id);
  header.set_mode(static_cast<v1::Mode>(mode));
  header.set_tokens(static_cast<uint64_t>(tokens));
  header.set_layers(static_cast<uint32_t>(layers));
  std::map<int, v1::LayerPlan> plans;
  for (const PlannedChunk& chunk : chunks) {
    v1::LayerPlan& plan = plans[chunk.layer];
    plan.set_layer(static_cast<uint32_t>(chunk.layer));
    plan.set_dtype(static_cast<v1::WireDtype>(chunk.dtype));
    const uint32_t rank = static_cast<uint32_t>(chunk.shape.back());
    if (chunk.kind == PayloadKind::kKeyCode) plan.set_rank_k(rank);
    if (chunk.kind == PayloadKind::kValueCode) plan.set_rank_v(rank);
    if (chunk.kind == PayloadKind::kHiddenCode) plan.set_rank_h(rank);
  }
  for (auto& [layer, plan] : plans) *header.add_layer_plan() = plan;
  header.set_expected_bytes(static_cast<uint64_t>(TotalBytes(chunks)));
  header.set_expected_chunks(chunks.size());
  return header;
}

v1::TransferHeader FrameHeader(const CodeBatch& batch, int layers,
                               const TransferIdentity& identity) {
  std::vector<PlannedChunk> chunks;
  chunks.reserve(batch.chunks.size());
  for (const CodeChunk& chunk : batch.chunks) {
    chunks.push_back({chunk.layer, chunk.kind, chunk.dtype, chunk.shape, chunk.bytes()});
  }
  return FrameHeader(batch.mode, batch.tokens, layers, chunks, identity);
}

FramedChunk FrameChunk(const CodeChunk& chunk) {
  FramedChunk framed;
  v1::CodeChunk& meta = framed.meta;
  meta.set_layer(static_cast<uint32_t>(chunk.layer));
  meta.set_kind(static_cast<v1::ChunkKind>(chunk.kind));
  meta.set_token_begin(static_cast<uint64_t>(chunk.token_begin));
  meta.set_token_end(static_cast<uint64_t>(chunk.token_end));
  meta.set_dtype(static_cast<v1::WireDtype>(chunk.dtype));
  for (int64_t d : chunk.shape) meta.add_shape(d);
  meta.set_scales(TensorBytes(chunk.scales));
  // A contiguous CPU tensor already is its bytes; anything else is copied once into one.
  auto data = std::make_shared<at::Tensor>(chunk.data.to(at::kCPU).contiguous());
  framed.data = static_cast<const uint8_t*>(data->data_ptr());
  framed.size = static_cast<size_t>(data->numel() * data->element_size());
  framed.owner = std::move(data);
  meta.set_payload_bytes(framed.size);
  return framed;
}

absl::StatusOr<TransferMode> ModeFromProto(v1::Mode mode) {
  if (mode < v1::MODE_LOCAL || mode > v1::MODE_SCD) {
    return absl::InvalidArgumentError(absl::StrCat("unknown transfer mode ", mode));
  }
  return static_cast<TransferMode>(mode);
}

absl::StatusOr<CodeChunk> UnframeChunk(const v1::CodeChunk& meta, absl::string_view payload,
                                       int64_t batch_tokens) {
  const std::string at = absl::StrCat("chunk ", meta.index(), ": ");
  if (meta.kind() < v1::KIND_KEY_CODE || meta.kind() > v1::KIND_HIDDEN_STATE) {
    return absl::InvalidArgumentError(absl::StrCat(at, "unknown kind ", meta.kind()));
  }
  if (meta.dtype() < v1::DTYPE_F32 || meta.dtype() > v1::DTYPE_INT4) {
    return absl::InvalidArgumentError(absl::StrCat(at, "unknown wire dtype ", meta.dtype()));
  }
  if (meta.layer() > (1u << 20) || meta.token_end() > (uint64_t{1} << 40)) {
    return absl::InvalidArgumentError(absl::StrCat(at, "layer or token range out of bounds"));
  }
  CodeChunk fields;
  fields.layer = static_cast<int>(meta.layer());
  fields.kind = static_cast<PayloadKind>(meta.kind());
  fields.dtype = static_cast<WireDtype>(meta.dtype());
  fields.token_begin = static_cast<int64_t>(meta.token_begin());
  fields.token_end = static_cast<int64_t>(meta.token_end());
  fields.shape.assign(meta.shape().begin(), meta.shape().end());
  return AssembleCodeChunk(fields, payload, meta.scales(), batch_tokens,
                           static_cast<int>(meta.index()));
}

}  // namespace scd
