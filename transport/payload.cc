#include "transport/payload.h"

#include <atomic>
#include <cstring>

#include "base/change_notice.h"

namespace scd::transport {
namespace {

std::atomic<int64_t> live_buffers{0};
std::atomic<int64_t> live_bytes{0};

// One counted buffer (ours or a caller's), released when the last Payload sharing it goes.
struct AdoptedBuffer {
  AdoptedBuffer(size_t n, std::function<void()> r) : size(n), release(std::move(r)) {
    live_buffers.fetch_add(1, std::memory_order_relaxed);
    live_bytes.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed);
  }
  ~AdoptedBuffer() {
    if (release) release();
    live_buffers.fetch_sub(1, std::memory_order_relaxed);
    live_bytes.fetch_sub(static_cast<int64_t>(size), std::memory_order_relaxed);
    NoteChange();  // what waits for the transport to let go of buffers wakes
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
  uint8_t* bytes = new uint8_t[size];
  *writable = bytes;
  return Adopt(bytes, size, [bytes] { delete[] bytes; });
}

Payload Payload::Copy(const void* data, size_t size) {
  uint8_t* out = nullptr;
  Payload payload = Allocate(size, &out);
  if (size > 0) std::memcpy(out, data, size);
  return payload;
}

int64_t LiveTransportBuffers() { return live_buffers.load(std::memory_order_relaxed); }
int64_t LiveTransportBufferBytes() { return live_bytes.load(std::memory_order_relaxed); }

bool AwaitLiveTransportBuffers(int64_t at_most, absl::Time deadline) {
  return AwaitChange([at_most] { return LiveTransportBuffers() <= at_most; }, deadline);
}

}  // namespace scd::transport
