// The 8-bit kernels of packed weights (model/packed_weight.h): y = x W^T (+ b) with W in int8
// panels (model/panel_layout.h, one scale per row of W) and x quantized per row, as the kernels of
// llama.cpp's Q8_0 quantize activations, but with one scale per row rather than per 32 values.
//
// Arithmetic, identical on every path: x's row m becomes xq = nearbyint(x * (127 / max|x_m|))
// (int8 in [-127, 127]; scale a_m = max|x_m| / 127); the dot product of xq with a column's int8
// weights is exact in int32 (|sum| < 2^31 for K < 133,000); y = float(dot) * (a_m * s_n) + b_n,
// each step rounded once, in that order. So the AVX-512 VNNI kernel (vpdpbusd: x + 128 as unsigned
// bytes against signed weights, 64 products per instruction, the offset's share taken back
// exactly), the AVX2 one (vpmaddwd on int16) and the scalar one give bit-identical results, and a
// row's result depends on nothing but its own x (the same alone or in any batch, on any thread).
// Thread-safety: reentrant.
#ifndef SCD_MODEL_INT8_PANELS_H_
#define SCD_MODEL_INT8_PANELS_H_

#include <cstdint>

#include "model/panel_layout.h"

namespace scd {

enum class Int8Kernel { kScalar, kAvx2, kAvx512Vnni };

// Quantizes rows of x (m rows of k floats, `in_stride` apart) into scale[m] and either u8
// (xq + 128, VNNI) or i16 (xq), rows `out_stride` apart, padded with zeros (xq) to out_stride.
void QuantizeInt8Rows(const float* x, int64_t m, int64_t k, int64_t in_stride, int64_t out_stride,
                      float* scale, uint8_t* u8, int16_t* i16);

// Every row of x against panels [p0, p1).
void Int8Panels(Int8Kernel kernel, const PanelProduct& p, int64_t p0, int64_t p1);

// Rows of x a kernel computes at once, and panels; work is shared out in groups of panels.
int64_t Int8PanelsPerItem(Int8Kernel kernel);

}  // namespace scd

#endif  // SCD_MODEL_INT8_PANELS_H_
