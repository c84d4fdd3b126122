#include "model/huge_pages.h"

#include <ATen/ATen.h>
#include <sys/mman.h>

#include <cstdlib>

namespace scd {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

}  // namespace

at::Tensor EmptyOnHugePages(at::IntArrayRef sizes, c10::ScalarType dtype) {
  int64_t numel = 1;
  for (int64_t s : sizes) numel *= s;
  const size_t bytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
  if (static_cast<int64_t>(bytes) < kHugePageMinBytes) return at::empty(sizes, dtype);
  const size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* p = std::aligned_alloc(kHugePage, rounded);
  if (p == nullptr) return at::empty(sizes, dtype);
#if defined(MADV_HUGEPAGE)
  (void)madvise(p, rounded, MADV_HUGEPAGE);  // advice only: "never" leaves ordinary pages
#endif
  return at::from_blob(p, sizes, [](void* data) { std::free(data); },
                       at::TensorOptions().dtype(dtype));
}

at::Tensor OnHugePages(const at::Tensor& t) {
  if (!t.defined() || !t.device().is_cpu() ||
      t.numel() * static_cast<int64_t>(t.element_size()) < kHugePageMinBytes) {
    return t;
  }
  at::Tensor out = EmptyOnHugePages(t.sizes(), t.scalar_type());
  out.copy_(t);
  return out;
}

}  // namespace scd
