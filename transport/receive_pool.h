// ReceivePool: the buffers a receiving backend puts arriving chunks into, reused instead of
// allocated per chunk. First-touching fresh memory (a page fault per 4 KiB) costs more than the
// copy into it: on the development VM a fresh 64 MiB buffer filled at ~300 MB/s, a reused one at
// ~20 GB/s. So buffers come from mmap, faulted in once when made (2 MiB-aligned and backed by
// transparent huge pages when large: fewer faults, fewer TLB misses while the NIC, cma or a copy
// fills them), in power-of-two classes from 64 KiB to 64 MiB, and go back to their class when the
// last Payload sharing them is released (on any thread). Larger requests, or a pool at its cap,
// get a plain counted buffer. A backend can register every buffer with its network library once
// (UCX: ucp_mem_map) through the hooks.
//
// The pool is shared by the Payloads it hands out, so a Payload may outlive its backend: after
// Shutdown the registrations are gone and a returned buffer is unmapped.
// Thread-safety: thread-safe. The hooks run on the thread calling Take / Shutdown.
#ifndef SCD_TRANSPORT_RECEIVE_POOL_H_
#define SCD_TRANSPORT_RECEIVE_POOL_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "transport/payload.h"

namespace scd::transport {

class ReceivePool : public std::enable_shared_from_this<ReceivePool> {
 public:
  static constexpr size_t kMinClassBytes = size_t{64} << 10;
  static constexpr int kClasses = 11;  // 64 KiB << 0..10: up to 64 MiB

  struct Options {
    size_t max_mapped_bytes = size_t{1} << 30;  // buffers made, idle or not
    size_t max_idle_bytes = size_t{1} << 30;    // returned buffers kept beyond this are unmapped
    size_t min_pooled_bytes = kMinClassBytes;   // smaller requests: plain counted buffers
    // Registers a new buffer with the network library; returns its handle (null: failed, the
    // buffer is not used). Unregister is called for every handle at Shutdown or when unmapped.
    // With registration, idle buffers are never unmapped before Shutdown (max_idle_bytes is raised
    // to max_mapped_bytes), so unregistering happens only where Shutdown is called.
    std::function<void*(void* data, size_t bytes)> register_memory;
    std::function<void(void* handle)> unregister_memory;
  };

  struct Buffer {
    uint8_t* data = nullptr;
    size_t capacity = 0;
    int size_class = 0;
    void* registration = nullptr;  // register_memory's handle
  };

  static std::shared_ptr<ReceivePool> Create(Options options);
  ~ReceivePool();
  ReceivePool(const ReceivePool&) = delete;
  ReceivePool& operator=(const ReceivePool&) = delete;

  // A buffer of at least `n` bytes from the pool, or null (too large, at the cap, after Shutdown,
  // or mapping / registration failed): the caller falls back to Payload::Allocate.
  Buffer* Take(size_t n);
  // A buffer Take handed out and nothing uses any more (a failed receive into it, say).
  void Give(Buffer* buffer);
  // The first `n` bytes of `buffer` as a counted Payload that gives it back when released.
  Payload Wrap(Buffer* buffer, size_t n);
  // `n` bytes to fill: a pooled buffer, or a plain counted one; `*writable` points at them.
  Payload Get(size_t n, uint8_t** writable);
  // Unregisters every buffer and unmaps the idle ones; buffers still in use are unmapped when
  // released. Take returns null from now on.
  void Shutdown();

  size_t mapped_bytes() const;
  size_t idle_bytes() const;

 private:
  explicit ReceivePool(Options options) : options_(std::move(options)) {}
  void Free(Buffer* buffer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  mutable absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Buffer*> free_[kClasses] ABSL_GUARDED_BY(mu_);
  std::set<Buffer*> all_ ABSL_GUARDED_BY(mu_);
  size_t mapped_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // including reservations being mapped
  size_t idle_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace scd::transport

#endif  // SCD_TRANSPORT_RECEIVE_POOL_H_
