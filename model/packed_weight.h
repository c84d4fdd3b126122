// PackedWeight: a weight matrix W [N, K] held below float32 for the CPU's own kernels -- 8-bit
// (one scale per row of W), bf16 or f16 -- and y = x W^T (+ b) against it with x and y in float32.
//
// Why: a decode step reads every weight once, so its time is the bytes it reads (bench/README.md,
// "Ahead of llama.cpp"): 8-bit weights are a quarter of float32's, 16-bit ones half. Prefill is
// arithmetic, and the same kernels do it with 64 (AVX-512 VNNI) or 32 (AVX-512 BF16) products per
// instruction where float32 FMA does 16. The layout (model/panel_layout.h) and the kernels
// (model/int8_panels.h, model/half_panels.h) are this project's; oneDNN (in Debian's libtorch)
// was measured beside them (bench/README.md).
//
// A row of y depends only on the same row of x: the same alone or in any batch, on any thread
// split (8-bit: bit-identical on every ISA too). 8-bit weights have one scale per row of W and x
// is quantized per block of 32 values at run time (model/int8_panels.h). Work is shared out over groups of panels with
// SkinnyParallelFor (model/skinny_gemm.h), so it follows the process's compute threads.
//
// Thread-safety: immutable after Pack; Apply may run concurrently.
#ifndef SCD_MODEL_PACKED_WEIGHT_H_
#define SCD_MODEL_PACKED_WEIGHT_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace scd {

enum class WeightFormat {
  kDense,  // the model's dtype, as an at::Tensor (not packed)
  kBF16,
  kF16,
  kInt8,
};
// "dense", "bf16", "f16", "int8".
const char* WeightFormatName(WeightFormat format);

class PackedWeight {
 public:
  PackedWeight() = default;

  // Packs w [N, K] (a CPU tensor of any floating dtype). 8-bit: per row, scale = max |w| / 127 and
  // q = nearbyint(w * 127 / max |w|), stored q + 128 (model/int8_panels.h). REQUIRES: format is
  // not kDense.
  static PackedWeight Pack(const at::Tensor& w, WeightFormat format);

  bool empty() const { return n_ == 0; }
  WeightFormat format() const { return format_; }
  int64_t rows() const { return n_; }
  int64_t cols() const { return k_; }
  // Memory it holds (panels, scales).
  int64_t bytes() const;

  // y [M, count] float32 = x W[n0 : n0 + count]^T + b[n0 : n0 + count] for x [M, K] float32 on the
  // CPU (b float32 [N] or undefined; count < 0: to the end). n0 must be a multiple of 16 (a
  // panel's first row) unless it is 0.
  at::Tensor Apply(const at::Tensor& x, const at::Tensor& b, int64_t n0 = 0,
                   int64_t count = -1) const;

  // float32 [N, K]: the values the kernels multiply by (8-bit: q x scale).
  at::Tensor Unpack() const;
  // Row n of that into out[0, K) (an embedding lookup).
  void UnpackRow(int64_t n, float* out) const;

  // What it stores (fingerprints): uint8 panels; float32 row scales (8-bit; else undefined).
  const at::Tensor& panels() const { return panels_; }
  const at::Tensor& scales() const { return scale_; }

 private:
  WeightFormat format_ = WeightFormat::kDense;
  int64_t n_ = 0, k_ = 0;
  int64_t groups_ = 0;   // padded K / G
  at::Tensor panels_;    // uint8 [panels * groups * 64]
  at::Tensor scale_;     // float32 [padded N] (8-bit)
};

}  // namespace scd

#endif  // SCD_MODEL_PACKED_WEIGHT_H_
