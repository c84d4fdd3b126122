// A process's memory as the system sees it, and handing back what the allocator holds freed.
//
// ResidentBytes: VmRSS of a process (/proc/PID/status).
// ReleaseFreeMemory: glibc's malloc keeps freed memory in its arenas (one per thread that met
// contention, up to 8 per CPU) and returns it to the system only from the top of a heap, so a
// long-running server whose threads free chunks of many sizes (gRPC messages, tensors, codes)
// holds more pages than it uses, a little more after each burst: the soak measured its producer
// at ~1.2 MB per 1,000 requests, all of it freed memory (malloc_trim gave it back). This returns
// every arena's free pages (malloc_trim(0): MADV_DONTNEED on whole free pages, chunks stay).
// MemoryTrimmer does so on a thread every `interval`, as jemalloc's and tcmalloc's background
// threads return what they hold; the daemons run one (--memory-trim-seconds).
// Without glibc's malloc (a sanitizer's, another allocator preloaded) nothing is released.
// Thread-safety: all thread-safe.
#ifndef SCD_BASE_PROCESS_MEMORY_H_
#define SCD_BASE_PROCESS_MEMORY_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace scd {

// VmRSS of `pid` (0: this process), in bytes; -1 when it cannot be read (the process is gone).
int64_t ResidentBytes(pid_t pid = 0);

// Hands the allocator's free pages back to the system: this process's resident bytes it released
// (before minus after; may be <= 0 when other threads allocated meanwhile).
int64_t ReleaseFreeMemory();

class MemoryTrimmer {
 public:
  // Starts the thread ("scd-trim"): ReleaseFreeMemory every `interval` (> 0).
  explicit MemoryTrimmer(absl::Duration interval);
  ~MemoryTrimmer();  // stops the thread (at once; no last trim)
  MemoryTrimmer(const MemoryTrimmer&) = delete;
  MemoryTrimmer& operator=(const MemoryTrimmer&) = delete;

  uint64_t trims() const { return trims_.load(); }
  // Resident bytes released over every trim (the positive ones).
  int64_t released_bytes() const { return released_.load(); }

 private:
  void Loop();

  const absl::Duration interval_;
  std::atomic<uint64_t> trims_{0};
  std::atomic<int64_t> released_{0};
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts once the rest is set
};

}  // namespace scd

#endif  // SCD_BASE_PROCESS_MEMORY_H_
