#include "transport/payload.h"

#include <atomic>
#include <cstring>

namespace scd::transport {
namespace {

std::atomic<int64_t> live_buffers{0};
std::atomic<int64_t> live_bytes{0};

// Owns one counted allocation; the count drops when the last Payload sharing it goes.
struct CountedBuffer {
  explicit CountedBuffer(size_t n) : bytes(new uint8_t[n]), size(n) {
    live_buffers.fetch_add(1, std::memory_order_relaxed);
    live_bytes.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed);
  }
  ~CountedBuffer() {
    live_buffers.fetch_sub(1, std::memory_order_relaxed);
    live_bytes.fetch_sub(static_cast<int64_t>(size), std::memory_order_relaxed);
  }
  CountedBuffer(const CountedBuffer&) = delete;
  CountedBuffer& operator=(const CountedBuffer&) = delete;
  std::unique_ptr<uint8_t[]> bytes;
  size_t size;
};

// A caller's buffer, counted while shared.
struct AdoptedBuffer {
  AdoptedBuffer(size_t n, std::function<void()> r) : size(n), release(std::move(r)) {
    live_buffers.fetch_add(1, std::memory_order_relaxed);
    live_bytes.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed);
  }
  ~AdoptedBuffer() {
    if (release) release();
    live_buffers.fetch_sub(1, std::memory_order_relaxed);
    live_bytes.fetch_sub(static_cast<int64_t>(size), std::memory_order_relaxed);
  }
  AdoptedBuffer(const AdoptedBuffer&) = delete;
  AdoptedBuffer& operator=(const AdoptedBuffer&) = delete;
  size_t size;
  std::function<void()> release;
};

}  // namespace

Payload Payload::Adopt(const uint8_t* data, size_t size, std::function<void()> release) {
  return Payload(data, size, std::make_shared<AdoptedBuffer>(size, std::move(release)));
}

Payload Payload::Allocate(size_t size, uint8_t** writable) {
  auto buffer = std::make_shared<CountedBuffer>(size);
  uint8_t* bytes = buffer->bytes.get();  // before the move below (argument order is unspecified)
  *writable = bytes;
  return Payload(bytes, size, std::move(buffer));
}

Payload Payload::Copy(const void* data, size_t size) {
  uint8_t* out = nullptr;
  Payload payload = Allocate(size, &out);
  if (size > 0) std::memcpy(out, data, size);
  return payload;
}

int64_t LiveTransportBuffers() { return live_buffers.load(std::memory_order_relaxed); }
int64_t LiveTransportBufferBytes() { return live_bytes.load(std::memory_order_relaxed); }

}  // namespace scd::transport
