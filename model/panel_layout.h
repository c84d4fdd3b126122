// The panel layout of packed weights (model/packed_weight.h) and what its kernels are handed.
//
// W [N, K] is cut into panels of 16 rows of W (16 output columns of y = x W^T). A panel stores K in
// groups of G consecutive k (G = 4 for 8-bit weights, 2 for 16-bit ones); a group holds, for each
// of its 16 columns in order, that column's G values: 64 bytes per group, [K / G][16][G] per panel.
// That is the operand layout of vpdpbusd (4 bytes per 32-bit lane) and vdpbf16ps (2 bf16 per lane):
// one load gives 16 columns' partial dot products, and x's G values are broadcast to every lane.
// N is padded with zero rows to a multiple of 16, K with zeros to a multiple of G.
// Thread-safety: plain data.
#ifndef SCD_MODEL_PANEL_LAYOUT_H_
#define SCD_MODEL_PANEL_LAYOUT_H_

#include <algorithm>
#include <cstdint>

namespace scd {

inline constexpr int64_t kPanelColumns = 16;
inline constexpr int64_t kPanelGroupBytes = 64;

// One product y[M, N] = x W^T (+ b) over panels, as the kernels see it.
struct PanelProduct {
  const uint8_t* w = nullptr;   // panel 0; panels `panel_bytes` apart
  int64_t panel_bytes = 0;      // groups * 64
  int64_t groups = 0;           // padded K / G
  int64_t n = 0;                // real columns (rows of W)
  const float* bias = nullptr;  // [n] or null
  float* y = nullptr;           // column n of row m at y + m * y_stride + n - y_first
  int64_t y_stride = 0;
  int64_t y_first = 0;  // the first column computed (a panel's first)
  int64_t m = 0;        // rows of x

  // 8-bit weights (stored q + 128): per-column scale. 8-bit x in blocks of 32 along k: per row and
  // block its scale and 128 x its sum (x_blocks per row), its values as int8 (VNNI) or int16
  // (AVX2, scalar), rows `x_stride` elements apart, padded K (model/int8_panels.h).
  const float* w_scale = nullptr;
  const float* x_block_scale = nullptr;
  const int32_t* x_block_sum128 = nullptr;
  int64_t x_blocks = 0;
  const int8_t* x_s8 = nullptr;
  const int16_t* x_i16 = nullptr;
  // 16-bit weights: x as bf16 bits (AVX-512 BF16) or float32, rows `x_stride` elements apart.
  const uint16_t* x_bf16 = nullptr;
  const float* x_f32 = nullptr;
  int64_t x_stride = 0;
};

// A kernel's register tile: rows m0.. of x against panels panel.. (how many is the tile's shape).
using PanelTile = void (*)(const PanelProduct&, int64_t m0, int64_t panel);

// Covers panels [p0, p1) and every row of x with `tiles`, where tiles[mr - 1][np - 1] is the tile
// of mr rows and np panels (mr <= rows, np <= panels). One row of x goes one panel at a time, so
// that consecutive panels are one sequential stream of W.
inline void ForEachTile(const PanelProduct& p, int64_t p0, int64_t p1,
                        const PanelTile* const* tiles, int64_t rows, int64_t panels) {
  const int64_t step = p.m == 1 ? 1 : panels;
  for (int64_t panel = p0; panel < p1; panel += step) {
    const int64_t np = std::min<int64_t>(step, p1 - panel);
    for (int64_t m0 = 0; m0 < p.m; m0 += rows) {
      tiles[std::min<int64_t>(rows, p.m - m0) - 1][np - 1](p, m0, panel);
    }
  }
}

}  // namespace scd

#endif  // SCD_MODEL_PANEL_LAYOUT_H_
