#include "codec/code_batch.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "codec/quantize.h"

namespace scd {

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

std::string WireDtypeName(WireDtype dtype) {
  switch (dtype) {
    case WireDtype::kF32:
      return "f32";
    case WireDtype::kF16:
      return "f16";
    case WireDtype::kBF16:
      return "bf16";
    case WireDtype::kInt8:
      return "int8";
    case WireDtype::kInt4:
      return "int4";
  }
  return "?";
}

absl::StatusOr<WireDtype> ParseWireDtype(const std::string& name) {
  for (WireDtype d :
       {WireDtype::kF32, WireDtype::kF16, WireDtype::kBF16, WireDtype::kInt8, WireDtype::kInt4}) {
    if (WireDtypeName(d) == name) return d;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("wire dtype '", name, "' is not one of f32, f16, bf16, int8, int4"));
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

at::Tensor UnpackTensor(const CodeChunk& chunk, c10::Device device) {
  at::Tensor out;
  switch (chunk.dtype) {
    case WireDtype::kF32:
    case WireDtype::kF16:
    case WireDtype::kBF16:
      out = chunk.data.to(at::kFloat);
      break;
    case WireDtype::kInt8:
      out = DequantizeInt8Rows(chunk.data, chunk.scales);
      break;
    case WireDtype::kInt4: {
      int64_t numel = 1;
      for (int64_t d : chunk.shape) numel *= d;
      out = DequantizeInt4Groups(chunk.data, chunk.scales, numel);
      break;
    }
  }
  return out.reshape(chunk.shape).to(device);
}

}  // namespace scd
