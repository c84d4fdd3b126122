#include "model/tensor_memory.h"

#include <ATen/core/Tensor.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>
#include <c10/core/alignment.h>

namespace scd {
namespace {

// A 64-bit glibc malloc chunk: 16 bytes of header and rounding to 16 (one size_t of it is usable
// by the chunk before, so this slightly overcounts).
constexpr int64_t kChunkHeader = 16;

int64_t Chunk(int64_t bytes) { return (bytes + 15) / 16 * 16 + kChunkHeader; }

}  // namespace

int64_t HeldBytes(const at::Tensor& tensor) {
  if (!tensor.defined()) return 0;
  const int64_t objects = Chunk(sizeof(c10::TensorImpl)) + Chunk(sizeof(c10::StorageImpl));
  if (!tensor.has_storage()) return objects;
  // c10's CPU allocator asks posix_memalign for gAlignment: up to that much slack beside the data.
  const int64_t data = static_cast<int64_t>(tensor.storage().nbytes());
  return objects + Chunk(data) + static_cast<int64_t>(c10::gAlignment);
}

at::Tensor CompactTensor(const at::Tensor& tensor) {
  if (!tensor.defined()) return tensor;
  const bool compact = !tensor.is_view() && tensor.is_contiguous() && tensor.has_storage() &&
                       tensor.storage_offset() == 0 && tensor.storage().nbytes() == tensor.nbytes();
  return compact ? tensor : tensor.clone(at::MemoryFormat::Contiguous);
}

}  // namespace scd
