// HeldBytes against glibc malloc's own count of bytes in use (mallinfo2) over thousands of
// tensors of several sizes and dtypes; why a cache keeps CompactTensor()s: a view made with
// autograd on (as the serving path runs) holds its base tensor and a view record beyond what
// HeldBytes counts, a compact copy does not; CompactTensor keeps a compact tensor as it is.
#include "model/tensor_memory.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <vector>

#include "base/process_memory.h"

namespace scd {
namespace {

#if defined(__SANITIZE_ADDRESS__)
#define SCD_SKIP_WITHOUT_GLIBC_MALLOC() GTEST_SKIP() << "a sanitizer's allocator, not glibc's"
#else
#define SCD_SKIP_WITHOUT_GLIBC_MALLOC() (void)0
#endif

constexpr int kCount = 2000;

// Per-tensor malloc growth while `make` builds kCount tensors that are kept.
template <typename Make>
double MeasuredPerTensor(Make make, std::vector<at::Tensor>* kept) {
  kept->clear();
  kept->reserve(kCount);
  const int64_t before = MallocInUseBytes();
  for (int i = 0; i < kCount; ++i) kept->push_back(make());
  return static_cast<double>(MallocInUseBytes() - before) / kCount;
}

TEST(TensorMemoryTest, HeldBytesIsWhatMallocHoldsForATensor) {
  SCD_SKIP_WITHOUT_GLIBC_MALLOC();
  struct Case {
    at::ScalarType dtype;
    int64_t numel;
  };
  for (const Case& c :
       {Case{at::kHalf, 1}, Case{at::kChar, 16}, Case{at::kHalf, 80}, Case{at::kFloat, 512},
        Case{at::kHalf, 1000}, Case{at::kFloat, 4096}, Case{at::kFloat, 16384}}) {
    SCOPED_TRACE(testing::Message() << c.dtype << " x " << c.numel);
    const at::Tensor source = at::ones({c.numel}, at::TensorOptions().dtype(c.dtype));
    std::vector<at::Tensor> kept;
    const double measured = MeasuredPerTensor([&] { return source.clone(); }, &kept);
    const int64_t held = HeldBytes(kept.front());
    EXPECT_GT(held, c.numel * static_cast<int64_t>(source.element_size()));
    EXPECT_NEAR(measured, static_cast<double>(held), 0.08 * static_cast<double>(held))
        << "malloc holds " << measured << " bytes a tensor, HeldBytes says " << held;
  }
}

TEST(TensorMemoryTest, AViewHoldsItsBaseACompactCopyDoesNot) {
  SCD_SKIP_WITHOUT_GLIBC_MALLOC();
  at::AutoGradMode grad(true);  // the serving path's mode: views are recorded
  const at::Tensor source = at::ones({4, 16, 8}, at::kHalf);
  std::vector<at::Tensor> views, compact;
  // Each view's base (a fresh copy) goes out of scope at once; only the view is kept.
  const double per_view = MeasuredPerTensor(
      [&] {
        return source.clone().reshape({64, 8});
      },
      &views);
  ASSERT_TRUE(views.front().is_view());
  const int64_t held = HeldBytes(views.front());
  EXPECT_GT(per_view, static_cast<double>(held) + 200.0)
      << "a view holds " << per_view << " bytes, its HeldBytes " << held;
  const double per_compact =
      MeasuredPerTensor([&, i = 0]() mutable { return CompactTensor(views[i++]); }, &compact);
  EXPECT_FALSE(compact.front().is_view());
  EXPECT_NEAR(per_compact, static_cast<double>(HeldBytes(compact.front())), 0.08 * held);
  EXPECT_TRUE(at::equal(compact.front(), views.front()));
}

TEST(TensorMemoryTest, CompactTensorCopiesOnlyWhatIsNotCompact) {
  const at::Tensor whole = at::arange(4 * 16 * 8, at::kFloat).reshape({4, 16, 8}).clone();
  ASSERT_FALSE(whole.is_view());
  // Compact already: the same tensor, no copy.
  EXPECT_TRUE(CompactTensor(whole).is_same(whole));
  // A narrow (not contiguous), a contiguous narrow (an offset into a bigger storage), a
  // transpose and a reshape view: copies holding just their elements.
  for (const at::Tensor& part : {whole.narrow(1, 4, 4), whole.narrow(0, 1, 2),
                                 whole.transpose(0, 1), whole.reshape({64, 8})}) {
    const at::Tensor c = CompactTensor(part);
    EXPECT_FALSE(c.is_same(part));
    EXPECT_FALSE(c.is_view());
    EXPECT_TRUE(c.is_contiguous());
    EXPECT_EQ(c.storage().nbytes(), static_cast<size_t>(part.numel()) * 4);
    EXPECT_EQ(c.sizes(), part.sizes());
    EXPECT_TRUE(at::equal(c, part));
    if (part.numel() < whole.numel()) {
      EXPECT_LT(HeldBytes(c), HeldBytes(whole));
    }
    EXPECT_EQ(HeldBytes(part), HeldBytes(whole));  // a view counts the storage it keeps alive
  }
  EXPECT_FALSE(CompactTensor(at::Tensor()).defined());
  EXPECT_EQ(HeldBytes(at::Tensor()), 0);
}

}  // namespace
}  // namespace scd
