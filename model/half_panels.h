// The 16-bit kernels of packed weights (model/packed_weight.h): y = x W^T (+ b) with W in bf16 or
// f16 panels (model/panel_layout.h) and x, y in float32.
//
// bf16 weights: x is rounded to bf16 (to nearest even), as llama.cpp does for its BF16 weights, and
// AVX-512 BF16 multiplies pairs with vdpbf16ps (32 products per instruction, float32 sums). Without
// it the weights are widened to float32 and multiplied with FMA (AVX2), or in plain C: the same
// products, summed in another order (results agree to float32 rounding, not bit for bit).
// f16 weights: widened to float32 (F16C) and multiplied with FMA against x in float32.
// On every path a row's result depends on nothing but its own x: the same alone or in any batch.
// Thread-safety: reentrant.
#ifndef SCD_MODEL_HALF_PANELS_H_
#define SCD_MODEL_HALF_PANELS_H_

#include <cstdint>

#include "model/panel_layout.h"

namespace scd {

enum class HalfKind { kBF16, kF16 };
enum class HalfKernel { kScalar, kAvx2, kAvx512Bf16 };

// float32 <-> bf16 (round to nearest even; NaN stays NaN) and f16 (IEEE half, nearest even).
uint16_t FloatToBf16(float v);
float Bf16ToFloat(uint16_t h);
uint16_t FloatToF16(float v);
float F16ToFloat(uint16_t h);

// The kernel for `kind` on this CPU (model/cpu_simd.h).
HalfKernel ChooseHalfKernel(HalfKind kind);

// x rows (m rows of k floats, `in_stride` apart) as the kernel reads them: bf16 bits for
// kAvx512Bf16 (into bf16), else float32 (into f32; rounded through bf16 first for bf16 weights),
// rows `out_stride` apart, zero-padded.
void PrepareHalfRows(HalfKind kind, HalfKernel kernel, const float* x, int64_t m, int64_t k,
                     int64_t in_stride, int64_t out_stride, uint16_t* bf16, float* f32);

// Every row of x against panels [p0, p1).
void HalfPanels(HalfKind kind, HalfKernel kernel, const PanelProduct& p, int64_t p0, int64_t p1);

// Panels a work item holds.
int64_t HalfPanelsPerItem(HalfKernel kernel);

}  // namespace scd

#endif  // SCD_MODEL_HALF_PANELS_H_
