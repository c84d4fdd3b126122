// PackedWeight (model/packed_weight.h) and its kernels (model/int8_panels.h, model/half_panels.h):
// - 8-bit: every kernel this CPU runs (scalar, AVX2, AVX-512 VNNI) equals, bit for bit, this
//   test's own evaluation of the documented arithmetic (a scale per row of W, a scale per block of
//   32 of x, exact integer block sums folded as acc = fma(d_b, a_b, acc), then acc * s_n + b_n),
//   on panels this test lays out itself from the layout's description (model/panel_layout.h,
//   weights stored q + 128); PackedWeight::Apply equals it too;
// - 16-bit: the product agrees with the float64 product of what the kernel multiplies (x rounded
//   to bf16 for bf16 weights; Unpack() for W) within the float32 bound of a K-term dot product,
//   gamma_K sum |x w| (Higham (3.4));
// - a row's result is bit-identical alone or in a batch, on one thread or two; a slice of the
//   columns equals those columns of the whole product; Unpack/UnpackRow give the stored values.
#include "model/packed_weight.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "model/cpu_simd.h"
#include "model/half_panels.h"
#include "model/int8_panels.h"
#include "model/panel_layout.h"
#include "model/skinny_gemm.h"
#include "tests/test_util.h"

namespace scd {
namespace {

struct Shape {
  int64_t n, k;
};
// Model shapes (stories260k, tinystories-4m) and odd ones: K not a multiple of 4, N not of 16.
const Shape kShapes[] = {{96, 64}, {64, 172}, {344, 64}, {1376, 256}, {256, 688},
                         {45, 70},  {17, 3},   {1, 5},    {2560, 2048}};

// Symmetric 8-bit quantization of each run of `block` values of a row (the row's length when 0).
struct Quantized {
  std::vector<int32_t> q;  // [rows, k]
  std::vector<float> scale;  // [rows, blocks]
  int64_t blocks = 0;
};
Quantized Quantize(const at::Tensor& t, int64_t block) {
  const at::Tensor c = t.contiguous();
  const int64_t rows = c.size(0), k = c.size(1), b = block > 0 ? block : k;
  Quantized out;
  out.blocks = (k + b - 1) / b;
  out.q.resize(rows * k);
  out.scale.resize(rows * out.blocks);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < out.blocks; ++j) {
      const float* x = c.data_ptr<float>() + r * k + j * b;
      const int64_t n = std::min(b, k - j * b);
      float amax = 0;
      for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
      const float inv = amax > 0 ? 127.0f / amax : 0.0f;
      out.scale[r * out.blocks + j] = amax / 127.0f;
      for (int64_t i = 0; i < n; ++i) {
        out.q[r * k + j * b + i] =
            static_cast<int32_t>(std::min(127.0f, std::max(-127.0f, std::nearbyint(x[i] * inv))));
      }
    }
  }
  return out;
}

// The documented 8-bit result, computed here.
at::Tensor Int8Reference(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  const Quantized qx = Quantize(x, kInt8Block), qw = Quantize(w, 0);
  const int64_t M = x.size(0), N = w.size(0), K = x.size(1);
  at::Tensor y = at::empty({M, N});
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      float acc = 0.0f;
      for (int64_t j = 0; j < qx.blocks; ++j) {
        int32_t d = 0;
        for (int64_t k = j * kInt8Block; k < std::min(K, (j + 1) * kInt8Block); ++k) {
          d += qx.q[m * K + k] * qw.q[n * K + k];
        }
        acc = std::fma(static_cast<float>(d), qx.scale[m * qx.blocks + j], acc);
      }
      float r = acc * qw.scale[n];
      if (b.defined()) r = r + b[n].item<float>();
      y[m][n] = r;
    }
  }
  return y;
}

bool BitEqual(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor ac = a.contiguous(), bc = b.contiguous();
  return ac.sizes() == bc.sizes() &&
         std::memcmp(ac.data_ptr(), bc.data_ptr(), ac.numel() * sizeof(float)) == 0;
}

std::vector<Int8Kernel> Int8KernelsHere() {
  std::vector<Int8Kernel> kernels = {Int8Kernel::kScalar};
  const KernelIsa isa = DetectKernelIsa();
  if (isa.avx2) kernels.push_back(Int8Kernel::kAvx2);
  if (isa.avx512_vnni) kernels.push_back(Int8Kernel::kAvx512Vnni);
  return kernels;
}

TEST(PackedWeightTest, EveryInt8KernelComputesTheDocumentedArithmeticOnTheDocumentedLayout) {
  at::manual_seed(3);
  for (const Shape s : kShapes) {
    if (s.n * s.k > 1 << 20) continue;  // the reference loops in plain C++
    const int64_t M = 7, kp = (s.k + kInt8Block - 1) / kInt8Block * kInt8Block, groups = kp / 4;
    const int64_t panels = (s.n + 15) / 16, blocks = kp / kInt8Block;
    at::Tensor x = at::randn({M, s.k}), w = at::randn({s.n, s.k}) * 0.05, b = at::randn({s.n});
    x[0][0] = 40.0f;  // an outlier: its block's scale, not the row's, is coarse
    const Quantized qw = Quantize(w, 0);
    // The layout: panel, group of 4 k, column, place in the group; stored q + 128, padding 128.
    std::vector<uint8_t> bytes(panels * groups * 64, 128);
    std::vector<float> w_scale(panels * 16, 0.0f);
    for (int64_t n = 0; n < s.n; ++n) {
      w_scale[n] = qw.scale[n];
      for (int64_t k = 0; k < s.k; ++k) {
        bytes[(n / 16) * groups * 64 + (k / 4) * 64 + (n % 16) * 4 + k % 4] =
            static_cast<uint8_t>(qw.q[n * s.k + k] + 128);
      }
    }
    const at::Tensor expected = Int8Reference(x, w, b);
    for (const Int8Kernel kernel : Int8KernelsHere()) {
      std::vector<float> x_scale(M * blocks);
      std::vector<int32_t> x_sum128(M * blocks);
      std::vector<int8_t> s8(M * kp);
      std::vector<int16_t> i16(M * kp);
      QuantizeInt8Rows(x.data_ptr<float>(), M, s.k, s.k, kp, x_scale.data(), x_sum128.data(),
                       s8.data(), i16.data());
      at::Tensor y = at::full({M, s.n}, std::nanf(""));
      PanelProduct p;
      p.w = bytes.data();
      p.panel_bytes = groups * 64;
      p.groups = groups;
      p.n = s.n;
      p.bias = b.data_ptr<float>();
      p.y = y.data_ptr<float>();
      p.y_stride = s.n;
      p.m = M;
      p.w_scale = w_scale.data();
      p.x_block_scale = x_scale.data();
      p.x_block_sum128 = x_sum128.data();
      p.x_blocks = blocks;
      p.x_s8 = s8.data();
      p.x_i16 = i16.data();
      p.x_stride = kp;
      Int8Panels(kernel, p, 0, panels);
      EXPECT_TRUE(BitEqual(y, expected))
          << s.n << "x" << s.k << " kernel " << static_cast<int>(kernel)
          << " max diff " << testing::MaxAbsDiff(y, expected);
    }
    const PackedWeight packed = PackedWeight::Pack(w, WeightFormat::kInt8);
    EXPECT_TRUE(BitEqual(packed.Apply(x, b), expected)) << s.n << "x" << s.k;
  }
}

TEST(PackedWeightTest, SixteenBitProductsAgreeWithFloat64WithinTheDotProductBound) {
  at::manual_seed(5);
  for (const WeightFormat format : {WeightFormat::kBF16, WeightFormat::kF16}) {
    for (const Shape s : kShapes) {
      for (int64_t M : {1, 3, 6, 7, 13}) {
        at::Tensor x = at::randn({M, s.k}), w = at::randn({s.n, s.k}) * 0.05;
        at::Tensor b = at::randn({s.n});
        const PackedWeight packed = PackedWeight::Pack(w, format);
        at::Tensor xd = (format == WeightFormat::kBF16 ? x.to(at::kBFloat16) : x).to(at::kDouble);
        at::Tensor wd = packed.Unpack().to(at::kDouble);
        at::Tensor exact = at::mm(xd, wd.t()) + b.to(at::kDouble);
        at::Tensor bound = testing::Float32Gamma(s.k + 1) *
                           (at::mm(xd.abs(), wd.abs().t()) + b.to(at::kDouble).abs() + 1e-30);
        EXPECT_LE(testing::MaxBoundRatio(packed.Apply(x, b), exact, bound), 1.0)
            << WeightFormatName(format) << " " << s.n << "x" << s.k << " M " << M;
      }
    }
  }
}

TEST(PackedWeightTest, UnpackGivesTheStoredValues) {
  at::manual_seed(9);
  at::Tensor w = at::randn({45, 70});
  const Quantized qw = Quantize(w, 0);
  const at::Tensor int8 = PackedWeight::Pack(w, WeightFormat::kInt8).Unpack();
  for (int64_t n = 0; n < 45; ++n) {
    for (int64_t k = 0; k < 70; ++k) {
      ASSERT_EQ(int8[n][k].item<float>(), static_cast<float>(qw.q[n * 70 + k]) * qw.scale[n]);
    }
  }
  EXPECT_TRUE(at::equal(PackedWeight::Pack(w, WeightFormat::kBF16).Unpack(),
                        w.to(at::kBFloat16).to(at::kFloat)));
  EXPECT_TRUE(at::equal(PackedWeight::Pack(w, WeightFormat::kF16).Unpack(),
                        w.to(at::kHalf).to(at::kFloat)));
  const PackedWeight packed = PackedWeight::Pack(w, WeightFormat::kInt8);
  std::vector<float> row(70);
  packed.UnpackRow(44, row.data());
  EXPECT_TRUE(at::equal(at::from_blob(row.data(), {70}), int8[44]));
}

TEST(PackedWeightTest, ARowsResultDoesNotDependOnItsBatchOrThreadsAndSlicesAgree) {
  at::manual_seed(11);
  for (const WeightFormat format : {WeightFormat::kInt8, WeightFormat::kBF16, WeightFormat::kF16}) {
    for (const Shape s : {Shape{1376, 256}, Shape{2560, 2048}, Shape{45, 70}}) {
      const PackedWeight packed = PackedWeight::Pack(at::randn({s.n, s.k}) * 0.05, format);
      at::Tensor b = at::randn({s.n});
      at::Tensor rows = at::randn({20, s.k});
      for (int threads : {1, 2}) {
        SetSkinnyThreads(threads);
        const at::Tensor all = packed.Apply(rows, b);
        for (int64_t m = 0; m < 20; m += 3) {
          EXPECT_TRUE(BitEqual(packed.Apply(rows.narrow(0, m, 1), b), all.narrow(0, m, 1)))
              << WeightFormatName(format) << " " << s.n << "x" << s.k << " row " << m;
          EXPECT_TRUE(BitEqual(packed.Apply(rows.narrow(0, 0, m + 1), b), all.narrow(0, 0, m + 1)));
        }
        if (s.n >= 48) {
          EXPECT_TRUE(BitEqual(packed.Apply(rows, b, 16, 32), all.narrow(1, 16, 32)));
          EXPECT_TRUE(BitEqual(packed.Apply(rows, b, 32), all.narrow(1, 32, s.n - 32)));
        }
      }
    }
  }
  SetSkinnyThreads(1);
}

}  // namespace
}  // namespace scd
