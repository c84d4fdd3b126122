#include "codec/code_batch.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "base/exception_guard.h"
#include "base/status_macros.h"
#include "codec/quantize.h"

namespace scd {

bool IsCodeKind(PayloadKind kind) {
  return kind == PayloadKind::kKeyCode || kind == PayloadKind::kValueCode ||
         kind == PayloadKind::kHiddenCode;
}

std::string PayloadKindName(PayloadKind kind) {
  switch (kind) {
    case PayloadKind::kKeyCode:
      return "key_code";
    case PayloadKind::kValueCode:
      return "value_code";
    case PayloadKind::kHiddenCode:
      return "hidden_code";
    case PayloadKind::kRawKey:
      return "raw_key";
    case PayloadKind::kRawValue:
      return "raw_value";
    case PayloadKind::kHiddenState:
      return "hidden_state";
  }
  return "?";
}

int64_t CodeChunk::bytes() const {
  int64_t n = data.defined() ? data.numel() * static_cast<int64_t>(data.element_size()) : 0;
  if (scales.defined()) n += scales.numel() * static_cast<int64_t>(scales.element_size());
  return n;
}

int64_t CodeBatch::bytes() const {
  int64_t total = 0;
  for (const CodeChunk& c : chunks) total += c.bytes();
  return total;
}

std::map<int, int64_t> CodeBatch::BytesPerLayer() const {
  std::map<int, int64_t> out;
  for (const CodeChunk& c : chunks) out[c.layer] += c.bytes();
  return out;
}

CodeChunk PackTensor(const at::Tensor& values, WireDtype dtype) {
  CodeChunk chunk;
  chunk.dtype = dtype;
  chunk.shape = values.sizes().vec();
  at::Tensor cpu = values.detach().to(at::kCPU, at::kFloat).contiguous();
  switch (dtype) {
    case WireDtype::kF32:
      chunk.data = cpu;
      break;
    case WireDtype::kF16:
      chunk.data = cpu.to(at::kHalf);
      break;
    case WireDtype::kBF16:
      chunk.data = cpu.to(at::kBFloat16);
      break;
    case WireDtype::kInt8: {
      QuantizedInt8 q = QuantizeInt8Rows(cpu);
      chunk.data = q.values;
      chunk.scales = q.scales;
      break;
    }
    case WireDtype::kInt4: {
      QuantizedInt4 q = QuantizeInt4Groups(cpu);
      chunk.data = q.packed;
      chunk.scales = q.scale_zero;
      break;
    }
  }
  return chunk;
}

namespace {

at::ScalarType DataType(WireDtype dtype) {
  switch (dtype) {
    case WireDtype::kF32:
      return at::kFloat;
    case WireDtype::kF16:
      return at::kHalf;
    case WireDtype::kBF16:
      return at::kBFloat16;
    case WireDtype::kInt8:
      return at::kChar;
    case WireDtype::kInt4:
      return at::kByte;
  }
  return at::kFloat;
}

int64_t TensorBytes(const at::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

}  // namespace

absl::StatusOr<ChunkByteCounts> ExpectedChunkBytes(WireDtype dtype,
                                                   const std::vector<int64_t>& shape) {
  if (shape.empty()) return absl::InvalidArgumentError("chunk shape is empty");
  ChunkByteCounts c;
  c.elements = 1;
  for (int64_t d : shape) {
    if (d < 1 || d > (int64_t{1} << 40) || c.elements > (int64_t{1} << 40) / d) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk shape has a dimension of ", d, " or more than 2^40 elements"));
    }
    c.elements *= d;
  }
  switch (dtype) {
    case WireDtype::kF32:
      c.data = 4 * c.elements;
      break;
    case WireDtype::kF16:
    case WireDtype::kBF16:
      c.data = 2 * c.elements;
      break;
    case WireDtype::kInt8:
      c.data = c.elements;
      c.scales = 2 * (c.elements / shape.back());  // one f16 scale per row
      break;
    case WireDtype::kInt4:
      c.data = (c.elements + 1) / 2;
      c.scales = 4 * ((c.elements + kInt4GroupSize - 1) / kInt4GroupSize);  // f16 scale, zero
      break;
  }
  return c;
}

absl::Status CheckChunkTensors(const CodeChunk& chunk) {
  SCD_ASSIGN_OR_RETURN(ChunkByteCounts want, ExpectedChunkBytes(chunk.dtype, chunk.shape));
  const std::string what = absl::StrCat("layer ", chunk.layer, " ", PayloadKindName(chunk.kind),
                                        " (", WireDtypeName(chunk.dtype), ")");
  if (!chunk.data.defined() || chunk.data.scalar_type() != DataType(chunk.dtype) ||
      TensorBytes(chunk.data) != want.data) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": data holds ", TensorBytes(chunk.data),
                                                   " bytes, the shape needs ", want.data));
  }
  const bool scales_ok = want.scales == 0
                             ? !chunk.scales.defined()
                             : chunk.scales.defined() && chunk.scales.scalar_type() == at::kHalf &&
                                   TensorBytes(chunk.scales) == want.scales;
  if (!scales_ok) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": scales hold ",
                                                   TensorBytes(chunk.scales),
                                                   " bytes, the shape needs ", want.scales));
  }
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> UnpackTensor(const CodeChunk& chunk, c10::Device device) {
  SCD_RETURN_IF_ERROR(CheckChunkTensors(chunk));
  return GuardExceptions("UnpackTensor", [&]() -> absl::StatusOr<at::Tensor> {
    at::Tensor out;
    switch (chunk.dtype) {
      case WireDtype::kF32:
      case WireDtype::kF16:
      case WireDtype::kBF16:
        out = chunk.data.to(at::kFloat);
        break;
      case WireDtype::kInt8:
        out = DequantizeInt8Rows(chunk.data.reshape(chunk.shape), chunk.scales.reshape({-1}));
        break;
      case WireDtype::kInt4: {
        int64_t numel = 1;
        for (int64_t d : chunk.shape) numel *= d;
        out = DequantizeInt4Groups(chunk.data.reshape({-1}), chunk.scales.reshape({-1, 2}), numel);
        break;
      }
    }
    return out.reshape(chunk.shape).to(device);
  });
}

}  // namespace scd
