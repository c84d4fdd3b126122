#include "model/packed_weight.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "model/cpu_simd.h"
#include "model/half_panels.h"
#include "model/huge_pages.h"
#include "model/int8_panels.h"
#include "model/panel_layout.h"
#include "model/skinny_gemm.h"

namespace scd {
namespace {

// Below this many weights (N x K) a product stays on the calling thread: waking a worker costs more.
constexpr int64_t kParallelMinWeights = int64_t{1} << 16;

int64_t RoundUp(int64_t v, int64_t to) { return (v + to - 1) / to * to; }
int64_t GroupSize(WeightFormat format) { return format == WeightFormat::kInt8 ? 4 : 2; }
// K is padded to a whole number of groups, and for 8-bit weights of blocks of x.
int64_t PaddedK(WeightFormat format, int64_t k) {
  return RoundUp(k, format == WeightFormat::kInt8 ? kInt8Block : GroupSize(format));
}

Int8Kernel ChooseInt8Kernel() {
  const KernelIsa& isa = RunnableKernelIsa();
  if (isa.avx512_vnni) return Int8Kernel::kAvx512Vnni;
  return isa.avx2 ? Int8Kernel::kAvx2 : Int8Kernel::kScalar;
}

HalfKind KindOf(WeightFormat format) {
  return format == WeightFormat::kBF16 ? HalfKind::kBF16 : HalfKind::kF16;
}

// Runs `panels(p0, p1)` over [first, last): one row of x in guided runs of consecutive panels
// (each a sequential stream; SkinnyParallelChunks), more rows in items of `per_item` panels (the
// kernel's tile width), on the compute pool when the matrix is worth it.
template <typename Fn>
void SharePanels(int64_t first, int64_t last, int64_t rows, int64_t per_item, bool parallel,
                 const Fn& panels) {
  if (!parallel) {
    panels(first, last);
    return;
  }
  if (rows == 1) {
    SkinnyParallelChunks(last - first, 4,
                         [&](int64_t a, int64_t z) { panels(first + a, first + z); });
    return;
  }
  const int64_t items = (last - first + per_item - 1) / per_item;
  SkinnyParallelFor(items, [&](int64_t i) {
    const int64_t p0 = first + i * per_item;
    panels(p0, std::min(last, p0 + per_item));
  });
}

}  // namespace

const char* WeightFormatName(WeightFormat format) {
  switch (format) {
    case WeightFormat::kDense:
      return "dense";
    case WeightFormat::kBF16:
      return "bf16";
    case WeightFormat::kF16:
      return "f16";
    case WeightFormat::kInt8:
      return "int8";
  }
  return "?";
}

PackedWeight PackedWeight::Pack(const at::Tensor& w, WeightFormat format) {
  const at::Tensor src = w.to(at::kCPU, at::kFloat).contiguous();
  PackedWeight packed;
  packed.format_ = format;
  packed.n_ = src.size(0);
  packed.k_ = src.size(1);
  const int64_t G = GroupSize(format), N = packed.n_, K = packed.k_;
  packed.groups_ = PaddedK(format, K) / G;
  const int64_t panels = RoundUp(N, kPanelColumns) / kPanelColumns;
  const int64_t panel_bytes = packed.groups_ * kPanelGroupBytes;
  // Padding: zero weights (8-bit: stored q + 128, so 128).
  packed.panels_ = EmptyOnHugePages({panels * panel_bytes}, at::kByte)
                       .fill_(format == WeightFormat::kInt8 ? 128 : 0);
  uint8_t* out = packed.panels_.data_ptr<uint8_t>();
  const float* in = src.data_ptr<float>();
  // Byte offset of (n, k): its panel, its group, its column in the group, its place in the column.
  const auto at_nk = [&](int64_t n, int64_t k) {
    return (n / kPanelColumns) * panel_bytes + (k / G) * kPanelGroupBytes +
           (n % kPanelColumns) * (kPanelGroupBytes / kPanelColumns) +
           (k % G) * (kPanelGroupBytes / kPanelColumns / G);
  };
  if (format == WeightFormat::kInt8) {
    packed.scale_ = at::zeros({panels * kPanelColumns}, at::kFloat);
    float* scale = packed.scale_.data_ptr<float>();
    for (int64_t n = 0; n < N; ++n) {
      const float* row = in + n * K;
      float amax = 0.0f;
      for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(row[k]));
      const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      scale[n] = amax / 127.0f;
      for (int64_t k = 0; k < K; ++k) {
        const float q = std::min(127.0f, std::max(-127.0f, std::nearbyint(row[k] * inv)));
        out[at_nk(n, k)] = static_cast<uint8_t>(static_cast<int32_t>(q) + 128);
      }
    }
    return packed;
  }
  const bool bf16 = format == WeightFormat::kBF16;
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) {
      const float v = in[n * K + k];
      const uint16_t h = bf16 ? FloatToBf16(v) : FloatToF16(v);
      std::memcpy(out + at_nk(n, k), &h, 2);
    }
  }
  return packed;
}

int64_t PackedWeight::bytes() const {
  int64_t total = 0;
  for (const at::Tensor* t : {&panels_, &scale_}) {
    if (t->defined()) total += t->numel() * static_cast<int64_t>(t->element_size());
  }
  return total;
}

at::Tensor PackedWeight::Apply(const at::Tensor& x_in, const at::Tensor& b, int64_t n0,
                               int64_t count) const {
  const at::Tensor x = x_in.to(at::kFloat).contiguous();
  const int64_t M = x.size(0), K = k_;
  const int64_t n1 = count < 0 ? n_ : n0 + count;
  at::Tensor out = at::empty({M, n1 - n0}, x.options());
  if (M == 0 || n1 == n0) return out;
  const int64_t kp = groups_ * GroupSize(format_);
  PanelProduct p;
  p.w = panels_.data_ptr<uint8_t>();
  p.panel_bytes = groups_ * kPanelGroupBytes;
  p.groups = groups_;
  p.n = n1;
  p.bias = b.defined() ? b.data_ptr<float>() : nullptr;
  p.y = out.data_ptr<float>();
  p.y_stride = n1 - n0;
  p.y_first = n0;
  p.m = M;
  p.x_stride = kp;
  const int64_t first = n0 / kPanelColumns, last = (n1 + kPanelColumns - 1) / kPanelColumns;
  const bool parallel = (n1 - n0) * K >= kParallelMinWeights;
  if (format_ == WeightFormat::kInt8) {
    const Int8Kernel kernel = ChooseInt8Kernel();
    const int64_t blocks = kp / kInt8Block;
    std::vector<float> x_scale(M * blocks);
    std::vector<int32_t> x_sum128(M * blocks);
    std::vector<int8_t> s8;
    std::vector<int16_t> i16;
    if (kernel == Int8Kernel::kAvx512Vnni) {
      s8.resize(M * kp);
    } else {
      i16.resize(M * kp);
    }
    QuantizeInt8Rows(x.data_ptr<float>(), M, K, K, kp, x_scale.data(), x_sum128.data(),
                     s8.empty() ? nullptr : s8.data(), i16.empty() ? nullptr : i16.data());
    p.w_scale = scale_.data_ptr<float>();
    p.x_block_scale = x_scale.data();
    p.x_block_sum128 = x_sum128.data();
    p.x_blocks = blocks;
    p.x_s8 = s8.empty() ? nullptr : s8.data();
    p.x_i16 = i16.empty() ? nullptr : i16.data();
    SharePanels(first, last, M, Int8PanelsPerItem(kernel), parallel,
                [&](int64_t a, int64_t z) { Int8Panels(kernel, p, a, z); });
    return out;
  }
  const HalfKind kind = KindOf(format_);
  const HalfKernel kernel = ChooseHalfKernel(kind);
  std::vector<uint16_t> bf16;
  std::vector<float> f32;
  if (kernel == HalfKernel::kAvx512Bf16) {
    bf16.resize(M * kp);
  } else {
    f32.resize(M * kp);
  }
  PrepareHalfRows(kind, kernel, x.data_ptr<float>(), M, K, K, kp,
                  bf16.empty() ? nullptr : bf16.data(), f32.empty() ? nullptr : f32.data());
  p.x_bf16 = bf16.empty() ? nullptr : bf16.data();
  p.x_f32 = f32.empty() ? nullptr : f32.data();
  SharePanels(first, last, M, HalfPanelsPerItem(kernel), parallel,
              [&](int64_t a, int64_t z) { HalfPanels(kind, kernel, p, a, z); });
  return out;
}

void PackedWeight::UnpackRow(int64_t n, float* out) const {
  const int64_t G = GroupSize(format_);
  const uint8_t* base = panels_.data_ptr<uint8_t>() +
                        (n / kPanelColumns) * groups_ * kPanelGroupBytes +
                        (n % kPanelColumns) * (kPanelGroupBytes / kPanelColumns);
  for (int64_t k = 0; k < k_; ++k) {
    const uint8_t* at = base + (k / G) * kPanelGroupBytes + (k % G) * (kPanelGroupBytes / kPanelColumns / G);
    if (format_ == WeightFormat::kInt8) {
      out[k] = static_cast<float>(static_cast<int32_t>(*at) - 128) * scale_.data_ptr<float>()[n];
    } else {
      uint16_t h;
      std::memcpy(&h, at, 2);
      out[k] = format_ == WeightFormat::kBF16 ? Bf16ToFloat(h) : F16ToFloat(h);
    }
  }
}

at::Tensor PackedWeight::Unpack() const {
  at::Tensor w = at::empty({n_, k_}, at::kFloat);
  float* out = w.data_ptr<float>();
  for (int64_t n = 0; n < n_; ++n) UnpackRow(n, out + n * k_);
  return w;
}

}  // namespace scd
