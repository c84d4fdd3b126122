#include "codec/chunk_rows.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/exception_guard.h"
#include "base/status_macros.h"
#include "codec/quantize.h"
#include "model/tensor_memory.h"

namespace scd {
namespace {

// The chunk's tensors viewed as [outer, T, ...] with positions in dimension 1.
struct RowView {
  at::Tensor data, scales;  // scales undefined for float dtypes
};

int64_t Outer(const std::vector<int64_t>& shape) {
  int64_t outer = 1;
  for (size_t i = 0; i + 2 < shape.size(); ++i) outer *= shape[i];
  return outer;
}

RowView View(const CodeChunk& chunk) {
  const std::vector<int64_t>& s = chunk.shape;
  const int64_t outer = Outer(s), T = s[s.size() - 2], C = s.back();
  RowView view;
  switch (chunk.dtype) {
    case WireDtype::kF32:
    case WireDtype::kF16:
    case WireDtype::kBF16:
      view.data = chunk.data.reshape({outer, T, C});
      break;
    case WireDtype::kInt8:
      view.data = chunk.data.reshape({outer, T, C});
      view.scales = chunk.scales.reshape({outer, T});
      break;
    case WireDtype::kInt4:
      view.data = chunk.data.reshape({outer, T, C / 2});
      view.scales = chunk.scales.reshape({outer, T, C / kInt4GroupSize, 2});
      break;
  }
  return view;
}

// The wire layout PackTensor gives for `rows` ([outer, T', ...]) of a chunk shaped `shape`.
void Store(const RowView& rows, CodeChunk* out) {
  switch (out->dtype) {
    case WireDtype::kF32:
    case WireDtype::kF16:
    case WireDtype::kBF16:
    case WireDtype::kInt8:
      out->data = rows.data.reshape(out->shape).contiguous();
      break;
    case WireDtype::kInt4:
      out->data = rows.data.reshape({-1}).contiguous();
      break;
  }
  if (out->dtype == WireDtype::kInt8) out->scales = rows.scales.reshape({-1}).contiguous();
  if (out->dtype == WireDtype::kInt4) out->scales = rows.scales.reshape({-1, 2}).contiguous();
}

absl::Status CheckSeparable(const CodeChunk& chunk) {
  if (!RowSeparable(chunk.dtype, chunk.shape)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layer ", chunk.layer, " ", PayloadKindName(chunk.kind), " (", WireDtypeName(chunk.dtype),
        ", last dimension ", chunk.shape.empty() ? 0 : chunk.shape.back(),
        ") is not packed per position"));
  }
  if (chunk.shape[chunk.shape.size() - 2] != chunk.token_end - chunk.token_begin) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layer ", chunk.layer, " ", PayloadKindName(chunk.kind), ": shape holds ",
        chunk.shape[chunk.shape.size() - 2], " positions, the chunk covers [", chunk.token_begin,
        ", ", chunk.token_end, ")"));
  }
  return CheckChunkTensors(chunk);
}

}  // namespace

bool RowSeparable(WireDtype dtype, const std::vector<int64_t>& shape) {
  if (shape.size() < 2) return false;
  return dtype != WireDtype::kInt4 || shape.back() % kInt4GroupSize == 0;
}

absl::StatusOr<CodeChunk> SliceChunkRows(const CodeChunk& chunk, int64_t begin, int64_t end) {
  SCD_RETURN_IF_ERROR(CheckSeparable(chunk));
  if (begin < chunk.token_begin || end > chunk.token_end || begin >= end) {
    return absl::InvalidArgumentError(absl::StrCat("positions [", begin, ", ", end,
                                                   ") are not inside the chunk's [",
                                                   chunk.token_begin, ", ", chunk.token_end, ")"));
  }
  return GuardExceptions("SliceChunkRows", [&]() -> absl::StatusOr<CodeChunk> {
    CodeChunk out;
    out.layer = chunk.layer;
    out.kind = chunk.kind;
    out.dtype = chunk.dtype;
    out.token_begin = begin;
    out.token_end = end;
    out.shape = chunk.shape;
    out.shape[out.shape.size() - 2] = end - begin;
    const RowView view = View(chunk);
    const int64_t offset = begin - chunk.token_begin;
    RowView rows;
    rows.data = view.data.narrow(1, offset, end - begin);
    if (view.scales.defined()) rows.scales = view.scales.narrow(1, offset, end - begin);
    Store(rows, &out);
    // Compact copies: a slice kept in a cache must hold neither the whole chunk's storage nor,
    // as a view, its base tensor (model/tensor_memory.h).
    out.data = CompactTensor(out.data);
    out.scales = CompactTensor(out.scales);
    return out;
  });
}

absl::StatusOr<CodeChunk> JoinChunkRows(const std::vector<const CodeChunk*>& parts) {
  if (parts.empty()) return absl::InvalidArgumentError("no chunks to join");
  const CodeChunk& first = *parts.front();
  std::vector<at::Tensor> data, scales;
  int64_t end = first.token_begin;
  for (const CodeChunk* part : parts) {
    SCD_RETURN_IF_ERROR(CheckSeparable(*part));
    const bool same_rows =
        part->shape.size() == first.shape.size() && part->shape.back() == first.shape.back() &&
        Outer(part->shape) == Outer(first.shape) &&
        std::equal(part->shape.begin(), part->shape.end() - 2, first.shape.begin());
    if (part->layer != first.layer || part->kind != first.kind || part->dtype != first.dtype ||
        !same_rows) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot join layer ", part->layer, " ", PayloadKindName(part->kind),
                       " to layer ", first.layer, " ", PayloadKindName(first.kind)));
    }
    if (part->token_begin != end) {
      return absl::InvalidArgumentError(absl::StrCat("a chunk of positions [", part->token_begin,
                                                     ", ", part->token_end,
                                                     ") does not follow position ", end));
    }
    end = part->token_end;
  }
  return GuardExceptions("JoinChunkRows", [&]() -> absl::StatusOr<CodeChunk> {
    if (parts.size() == 1) return first;
    for (const CodeChunk* part : parts) {
      const RowView view = View(*part);
      data.push_back(view.data);
      if (view.scales.defined()) scales.push_back(view.scales);
    }
    CodeChunk out;
    out.layer = first.layer;
    out.kind = first.kind;
    out.dtype = first.dtype;
    out.token_begin = first.token_begin;
    out.token_end = end;
    out.shape = first.shape;
    out.shape[out.shape.size() - 2] = end - first.token_begin;
    RowView rows;
    rows.data = at::cat(data, 1);
    if (!scales.empty()) rows.scales = at::cat(scales, 1);
    Store(rows, &out);
    return out;
  });
}

absl::StatusOr<CodeChunk> LowerChunkRank(const CodeChunk& chunk, int64_t rank) {
  return GuardExceptions("LowerChunkRank", [&]() -> absl::StatusOr<CodeChunk> {
    if (!IsCodeKind(chunk.kind)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a ", PayloadKindName(chunk.kind), " has no nested rank to lower"));
    }
    SCD_RETURN_IF_ERROR(CheckChunkTensors(chunk));
    const int64_t columns = chunk.shape.back();
    if (rank < 1 || rank > columns) {
      return absl::InvalidArgumentError(absl::StrCat(PayloadKindName(chunk.kind), " of layer ",
                                                     chunk.layer, ": rank ", rank, " of ",
                                                     columns, " columns"));
    }
    if (rank == columns) return chunk;
    CodeChunk out;
    switch (chunk.dtype) {
      case WireDtype::kF32:
      case WireDtype::kF16:
      case WireDtype::kBF16:
        out.dtype = chunk.dtype;
        out.shape = chunk.shape;
        out.data = chunk.data.reshape(chunk.shape).narrow(-1, 0, rank).contiguous();
        break;
      case WireDtype::kInt8:
      case WireDtype::kInt4: {
        SCD_ASSIGN_OR_RETURN(at::Tensor values, UnpackTensor(chunk, at::kCPU));
        out = PackTensor(values.narrow(-1, 0, rank), chunk.dtype);
        break;
      }
    }
    out.shape.back() = rank;
    out.layer = chunk.layer;
    out.kind = chunk.kind;
    out.token_begin = chunk.token_begin;
    out.token_end = chunk.token_end;
    return out;
  });
}

absl::StatusOr<CodeChunk> JoinMixedRankRows(const std::vector<const CodeChunk*>& parts) {
  if (parts.empty()) return absl::InvalidArgumentError("no chunks to join");
  int64_t rank = 0;
  bool mixed = false, separable = true;
  for (const CodeChunk* part : parts) {
    if (!IsCodeKind(part->kind) || part->shape.size() < 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layer ", part->layer, " ", PayloadKindName(part->kind), " has no nested rank"));
    }
    mixed |= rank != 0 && part->shape.back() != rank;
    separable &= RowSeparable(part->dtype, part->shape);
    rank = std::max(rank, part->shape.back());
  }
  if (parts.size() == 1) {  // nothing to join (an int4 code need not be packed per position)
    SCD_RETURN_IF_ERROR(CheckChunkTensors(*parts[0]));
    return *parts[0];
  }
  // One rank, packed per position: joined on the packed bytes. Else (an int4 rank that is no
  // multiple of its groups packs across positions) through the values.
  if (!mixed && separable) return JoinChunkRows(parts);
  return GuardExceptions("JoinMixedRankRows", [&]() -> absl::StatusOr<CodeChunk> {
    std::vector<CodeChunk> widened;  // each piece as f32 at `rank` columns
    widened.reserve(parts.size());
    for (const CodeChunk* part : parts) {
      SCD_ASSIGN_OR_RETURN(at::Tensor values, UnpackTensor(*part, at::kCPU));
      values = at::constant_pad_nd(values, {0, rank - part->shape.back()});
      CodeChunk wide = PackTensor(values, WireDtype::kF32);
      wide.layer = part->layer;
      wide.kind = part->kind;
      wide.token_begin = part->token_begin;
      wide.token_end = part->token_end;
      widened.push_back(std::move(wide));
    }
    std::vector<const CodeChunk*> wide_parts;
    for (const CodeChunk& wide : widened) wide_parts.push_back(&wide);
    return JoinChunkRows(wide_parts);
  });
}

}  // namespace scd
