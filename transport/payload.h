// Payload: a read-only view of bulk bytes plus the owner that keeps them alive. Transports move
// Payloads without copying where the backend allows it: the sender's view points into the
// producer's own memory (its owner holds that memory until the backend is done with it), and a
// receiving backend hands over the buffer it received into.
//
// Buffers the transport layer allocates itself (Payload::Allocate / Payload::Copy) are counted
// process-wide, so tests and metrics can see that every one is released (on completion, cancel,
// deadline and peer loss).
// Thread-safety: a Payload is an immutable value; copies share the owner (reference counted).
#ifndef SCD_TRANSPORT_PAYLOAD_H_
#define SCD_TRANSPORT_PAYLOAD_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace scd::transport {

class Payload {
 public:
  Payload() = default;
  // A view of `size` bytes at `data`, kept alive by `owner` (may be null when the caller guarantees
  // the bytes outlive every use).
  Payload(const uint8_t* data, size_t size, std::shared_ptr<const void> owner)
      : data_(data), size_(size), owner_(std::move(owner)) {}

  // A counted buffer of `size` bytes; `*writable` points at it until the Payload is shared.
  static Payload Allocate(size_t size, uint8_t** writable);
  // A counted buffer the caller allocated (from a registered pool, say): `release` runs once the
  // last Payload sharing it is gone.
  static Payload Adopt(const uint8_t* data, size_t size, std::function<void()> release);
  // A counted copy of `size` bytes.
  static Payload Copy(const void* data, size_t size);

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  absl::string_view view() const {
    return absl::string_view(reinterpret_cast<const char*>(data_), size_);
  }
  // Drops the view and this reference to its owner.
  void Reset() { *this = Payload(); }

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::shared_ptr<const void> owner_;
};

// Buffers allocated by Payload::Allocate / Copy and not yet released, in this process.
int64_t LiveTransportBuffers();
int64_t LiveTransportBufferBytes();
// Waits until at most `at_most` such buffers are live (woken by each release, never polling) or
// `deadline` passes; returns whether they were.
bool AwaitLiveTransportBuffers(int64_t at_most, absl::Time deadline);

}  // namespace scd::transport

#endif  // SCD_TRANSPORT_PAYLOAD_H_
