// Weights on 2 MiB pages. A decode step streams every weight once, and with 4 KiB pages a
// gigabyte of weights is a quarter of a million TLB misses per step: on the 2-core VM the
// TinyLlama shape's float32 decode read 27 GB/s from ordinary anonymous memory and 30 GB/s from
// the same bytes on huge pages (bench/README.md, "Ahead of llama.cpp"; llama.cpp's mmap'd GGUF
// lands on the page cache's huge folios). Linux gives an anonymous mapping huge pages where
// transparent huge pages are "always", or "madvise" and the mapping asks (MADV_HUGEPAGE); with
// "never" these are ordinary pages and nothing else changes.
// Thread-safety: stateless functions.
#ifndef SCD_MODEL_HUGE_PAGES_H_
#define SCD_MODEL_HUGE_PAGES_H_

#include <ATen/core/Tensor.h>

namespace scd {

// Tensors smaller than this stay where they are (a huge page would be mostly empty).
inline constexpr int64_t kHugePageMinBytes = int64_t{4} << 20;

// An uninitialised contiguous CPU tensor whose storage is 2 MiB-aligned and advised
// MADV_HUGEPAGE (ordinary memory below kHugePageMinBytes).
at::Tensor EmptyOnHugePages(at::IntArrayRef sizes, c10::ScalarType dtype);

// `t` moved onto huge pages (a contiguous copy; the original is released when no one else holds
// it). Non-CPU, undefined or small tensors are returned as they are.
at::Tensor OnHugePages(const at::Tensor& t);

}  // namespace scd

#endif  // SCD_MODEL_HUGE_PAGES_H_
