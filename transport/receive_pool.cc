#include "transport/receive_pool.h"

#include <spdlog/spdlog.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>

namespace scd::transport {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

// Anonymous memory faulted in now rather than on the first receive into it; 2 MiB-aligned and
// advised for transparent huge pages when large enough for the kernel to use them.
void* MapMemory(size_t capacity) {
  if (capacity < kHugePage) {
    void* memory = mmap(nullptr, capacity, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    return memory == MAP_FAILED ? nullptr : memory;
  }
  void* raw = mmap(nullptr, capacity + kHugePage, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + kHugePage - 1) & ~(kHugePage - 1);
  if (aligned > start) munmap(raw, aligned - start);
  const size_t tail = start + kHugePage - aligned;
  if (tail > 0) munmap(reinterpret_cast<void*>(aligned + capacity), tail);
  void* memory = reinterpret_cast<void*>(aligned);
  madvise(memory, capacity, MADV_HUGEPAGE);
#ifdef MADV_POPULATE_WRITE
  if (madvise(memory, capacity, MADV_POPULATE_WRITE) == 0) return memory;
#endif
  for (size_t offset = 0; offset < capacity; offset += 4096) {
    static_cast<volatile uint8_t*>(memory)[offset] = 0;
  }
  return memory;
}

}  // namespace

std::shared_ptr<ReceivePool> ReceivePool::Create(Options options) {
  if (options.register_memory) {
    options.max_idle_bytes = std::max(options.max_idle_bytes, options.max_mapped_bytes);
  }
  return std::shared_ptr<ReceivePool>(new ReceivePool(std::move(options)));
}

ReceivePool::~ReceivePool() {
  absl::MutexLock lock(&mu_);
  for (Buffer* buffer : std::set<Buffer*>(all_)) Free(buffer);
}

ReceivePool::Buffer* ReceivePool::Take(size_t n) {
  int size_class = 0;
  while (size_class < kClasses && (kMinClassBytes << size_class) < n) ++size_class;
  if (size_class == kClasses) return nullptr;
  const size_t capacity = kMinClassBytes << size_class;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return nullptr;
    std::vector<Buffer*>& free_list = free_[size_class];
    if (!free_list.empty()) {
      Buffer* buffer = free_list.back();
      free_list.pop_back();
      idle_bytes_ -= capacity;
      return buffer;
    }
    if (mapped_bytes_ + capacity > options_.max_mapped_bytes) return nullptr;
    mapped_bytes_ += capacity;  // reserved; mapping happens outside the lock
  }
  auto buffer = std::make_unique<Buffer>();
  buffer->capacity = capacity;
  buffer->size_class = size_class;
  buffer->data = static_cast<uint8_t*>(MapMemory(capacity));
  if (buffer->data != nullptr && options_.register_memory) {
    buffer->registration = options_.register_memory(buffer->data, capacity);
    if (buffer->registration == nullptr) {
      munmap(buffer->data, capacity);
      buffer->data = nullptr;
    }
  }
  absl::MutexLock lock(&mu_);
  if (buffer->data == nullptr) {
    mapped_bytes_ -= capacity;
    return nullptr;
  }
  all_.insert(buffer.get());
  if (shut_down_) {  // shut down while this buffer was mapped: no registration may outlive it
    Free(buffer.release());
    return nullptr;
  }
  return buffer.release();
}

void ReceivePool::Give(Buffer* buffer) {
  absl::MutexLock lock(&mu_);
  if (shut_down_ || idle_bytes_ + buffer->capacity > options_.max_idle_bytes) {
    Free(buffer);
    return;
  }
  free_[buffer->size_class].push_back(buffer);
  idle_bytes_ += buffer->capacity;
}

Payload ReceivePool::Wrap(Buffer* buffer, size_t n) {
  return Payload::Adopt(buffer->data, n,
                        [pool = shared_from_this(), buffer] { pool->Give(buffer); });
}

Payload ReceivePool::Get(size_t n, uint8_t** writable) {
  Buffer* buffer = n >= options_.min_pooled_bytes ? Take(n) : nullptr;
  if (buffer == nullptr) return Payload::Allocate(n, writable);
  *writable = buffer->data;
  return Wrap(buffer, n);
}

void ReceivePool::Shutdown() {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return;
  shut_down_ = true;
  for (Buffer* buffer : all_) {
    if (buffer->registration != nullptr && options_.unregister_memory) {
      options_.unregister_memory(buffer->registration);
    }
    buffer->registration = nullptr;
  }
  for (std::vector<Buffer*>& free_list : free_) {
    for (Buffer* buffer : std::vector<Buffer*>(free_list)) Free(buffer);
    free_list.clear();
  }
  idle_bytes_ = 0;
}

size_t ReceivePool::mapped_bytes() const {
  absl::MutexLock lock(&mu_);
  return mapped_bytes_;
}

size_t ReceivePool::idle_bytes() const {
  absl::MutexLock lock(&mu_);
  return idle_bytes_;
}

void ReceivePool::Free(Buffer* buffer) {
  if (buffer->registration != nullptr && options_.unregister_memory) {
    options_.unregister_memory(buffer->registration);
  }
  munmap(buffer->data, buffer->capacity);
  mapped_bytes_ -= buffer->capacity;
  all_.erase(buffer);
  delete buffer;
}

}  // namespace scd::transport
