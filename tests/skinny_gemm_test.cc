// SkinnyGemm (model/skinny_gemm.h) against at::mm in float64, and its batch invariance:
// - every shape the models use and odd ones (K not a multiple of 8, N not a multiple of the tile,
//   1..64 rows, with and without bias) agrees with the float64 product within the float32 bound
//   of a K-term dot product in any order, |err| <= gamma_K sum |x_i w_i| (Higham (3.4)), element
//   by element;
// - a row's outputs are bit-identical whatever rows are computed with it, on however many threads;
// - what the kernel does not take (other dtypes, non-contiguous, too many rows) it refuses.
#include "model/skinny_gemm.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace scd {
namespace {

class SkinnyGemmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!SkinnyGemmAvailable()) GTEST_SKIP() << "this CPU has no AVX2 + FMA: BLAS is used";
  }
};

TEST_F(SkinnyGemmTest, MatchesFloat64WithinTheDotProductBound) {
  at::manual_seed(7);
  struct Shape {
    int64_t N, K;
  };
  for (const Shape s : {Shape{512, 256}, Shape{1376, 256}, Shape{256, 688}, Shape{172, 64},
                        Shape{37, 13}, Shape{1, 8}, Shape{2050, 2048}}) {
    for (int64_t M : {1, 2, 3, 5, 8, 13, 16, 33, 64}) {
      for (bool with_bias : {false, true}) {
        at::Tensor x = at::randn({M, s.K}), w = at::randn({s.N, s.K});
        at::Tensor b = with_bias ? at::randn({s.N}) : at::Tensor();
        at::Tensor y;
        ASSERT_TRUE(SkinnyGemm(x, w, b, &y)) << s.N << "x" << s.K << " M " << M;
        at::Tensor xd = x.to(at::kDouble), wd = w.to(at::kDouble);
        at::Tensor exact = at::mm(xd, wd.t());
        // One more term for the bias's addition.
        at::Tensor bound =
            testing::Float32Gamma(s.K + 1) * (at::mm(xd.abs(), wd.abs().t()) + 1e-30);
        if (with_bias) {
          exact += b.to(at::kDouble);
          bound += testing::Float32Gamma(s.K + 1) * b.to(at::kDouble).abs();
        }
        EXPECT_LE(testing::MaxBoundRatio(y, exact, bound), 1.0)
            << s.N << "x" << s.K << " M " << M << (with_bias ? " bias" : "");
      }
    }
  }
}

TEST_F(SkinnyGemmTest, ARowsResultDoesNotDependOnItsBatchOrThreads) {
  at::manual_seed(11);
  at::Tensor w = at::randn({1376, 256}), big = at::randn({2560, 2048});
  for (const at::Tensor* weights : {&w, &big}) {
    const int64_t K = weights->size(1);
    at::Tensor rows = at::randn({64, K});
    at::Tensor all;
    ASSERT_TRUE(SkinnyGemm(rows, *weights, at::Tensor(), &all));
    for (int64_t M : {1, 2, 3, 4, 7, 8, 9, 16, 31}) {
      for (int64_t first : {int64_t{0}, int64_t{5}, 64 - M}) {
        at::Tensor y;
        ASSERT_TRUE(SkinnyGemm(rows.narrow(0, first, M).contiguous(), *weights, at::Tensor(), &y));
        EXPECT_TRUE(at::equal(y, all.narrow(0, first, M))) << "M " << M << " from " << first;
      }
    }
    for (int threads : {1, 2, 3}) {
      SetSkinnyThreads(threads);
      at::Tensor y;
      ASSERT_TRUE(SkinnyGemm(rows, *weights, at::Tensor(), &y));
      EXPECT_TRUE(at::equal(y, all)) << threads << " threads";
    }
  }
  SetSkinnyThreads(2);
}

TEST_F(SkinnyGemmTest, RefusesWhatItDoesNotTake) {
  at::Tensor x = at::randn({4, 32}), w = at::randn({16, 32}), y;
  EXPECT_FALSE(SkinnyGemm(x.to(at::kDouble), w.to(at::kDouble), at::Tensor(), &y));
  EXPECT_FALSE(SkinnyGemm(x.to(at::kBFloat16), w.to(at::kBFloat16), at::Tensor(), &y));
  EXPECT_FALSE(SkinnyGemm(x, at::randn({32, 16}).t(), at::Tensor(), &y));  // not contiguous
  const at::Tensor large = at::randn({1024, 1024});  // past kSkinnySmallWeights
  EXPECT_FALSE(SkinnyGemm(at::randn({kSkinnyMaxRows + 1, 1024}), large, at::Tensor(), &y));
  EXPECT_TRUE(SkinnyGemm(at::randn({kSkinnyMaxRows + 1, 32}), w, at::Tensor(), &y));  // small W
  y = at::Tensor();
  EXPECT_FALSE(SkinnyGemm(x, at::randn({16, 31}), at::Tensor(), &y));  // K differs
  EXPECT_FALSE(SkinnyGemm(x, w, at::randn({15}), &y));                // bias size
  EXPECT_FALSE(y.defined());
}

}  // namespace
}  // namespace scd
