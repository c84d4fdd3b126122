// What a CPU tensor keeps alive in host memory, for caches whose budget must bound what they
// really hold. A tensor's element bytes undercount it: every tensor also holds a TensorImpl and a
// StorageImpl (each its own allocation), and its data is one 64-byte-aligned allocation of its
// whole storage, each allocation with malloc's header -- for the small code chunks a prefix cache
// keeps per block, more than the data (~380 bytes a tensor). A view holds more still: its whole
// base storage and, made while autograd is on (as the serving path runs), its base tensor and a
// view record (~450 bytes more). So a cache keeps CompactTensor()s and counts their HeldBytes.
// tests/tensor_memory_test.cc checks both against malloc's own count of bytes in use.
// Thread-safety: pure functions.
#ifndef SCD_MODEL_TENSOR_MEMORY_H_
#define SCD_MODEL_TENSOR_MEMORY_H_

#include <cstdint>

namespace at {
class Tensor;
}  // namespace at

namespace scd {

// The bytes `tensor` holds when it is compact (below); 0 for an undefined tensor. Tensors sharing
// one storage each count it (overcounts, never under).
int64_t HeldBytes(const at::Tensor& tensor);

// `tensor` itself when it is compact -- not a view, contiguous, its storage exactly its elements
// -- else a contiguous copy that is (undefined stays undefined).
at::Tensor CompactTensor(const at::Tensor& tensor);

}  // namespace scd

#endif  // SCD_MODEL_TENSOR_MEMORY_H_
