// The 8-bit kernels of packed weights (model/packed_weight.h): y = x W^T (+ b) with W in int8
// panels (model/panel_layout.h; one scale per row of W, each weight stored as q + 128) and x
// quantized at run time in blocks of 32 values along k, as llama.cpp's Q8_0 kernels quantize their
// activations. (One scale per row of x was measured too: the hard pair's scd KL with 8-bit
// consumers moved 9.7 % from float32's, against 4.9 % with blocks of 32, and weights with one scale
// per row moved it by nothing: bench/README.md, "Ahead of llama.cpp".)
//
// Arithmetic, identical on every path: block b of x's row m becomes xq = nearbyint(x * (127 /
// max|x_b|)) in [-127, 127] with scale a_mb = max|x_b| / 127; its dot product with a column's int8
// weights q is exact in int32 (|d| <= 32 * 127 * 127 < 2^24, so exact in float32 too); the
// blocks are summed in order as acc = fma(float(d_b), a_mb, acc), and y = acc * s_n (+ b_n), each
// step rounded once. The AVX-512 VNNI kernel (vpdpbusd: the stored q + 128 as unsigned bytes
// against signed xq, 64 products per instruction, 128 * sum(xq) taken back per block), the AVX2
// one (vpmaddwd on int16) and the scalar one give bit-identical results, and a row's result
// depends on nothing but its own x (the same alone or in any batch, on any thread).
// Thread-safety: reentrant.
#ifndef SCD_MODEL_INT8_PANELS_H_
#define SCD_MODEL_INT8_PANELS_H_

#include <cstdint>

#include "model/panel_layout.h"

namespace scd {

enum class Int8Kernel { kScalar, kAvx2, kAvx512Vnni };

// Values of x per quantization block (K is padded to a multiple of it).
inline constexpr int64_t kInt8Block = 32;

// Quantizes rows of x (m rows of k floats, `in_stride` apart) into blocks of kInt8Block: per row
// and block its scale (scale[r * blocks + b]) and 128 x the sum of its xq (sum128, same index),
// and xq as int8 (s8) and/or int16 (i16; either may be null), rows `out_stride` apart (a multiple of
// kInt8Block, blocks = out_stride / kInt8Block), zero-padded.
void QuantizeInt8Rows(const float* x, int64_t m, int64_t k, int64_t in_stride, int64_t out_stride,
                      float* scale, int32_t* sum128, int8_t* s8, int16_t* i16);

// Every row of x against panels [p0, p1).
void Int8Panels(Int8Kernel kernel, const PanelProduct& p, int64_t p0, int64_t p1);

// Panels a work item holds (the kernel's tile width).
int64_t Int8PanelsPerItem(Int8Kernel kernel);

}  // namespace scd

#endif  // SCD_MODEL_INT8_PANELS_H_
