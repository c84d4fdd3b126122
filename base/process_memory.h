// A process's memory as the system sees it, and handing back what the allocator holds freed.
//
// ResidentBytes: VmRSS of a process (/proc/PID/status); ResidentOf: the same by kind -- anonymous
// pages (the heap, arenas, stacks: what the process allocated) apart from file-backed ones (the
// pages of its libraries' code and data it has touched, which grow as new code paths first run
// and which the kernel can drop and reread).
// ReleaseFreeMemory: glibc's malloc keeps freed memory in its arenas (one per thread that met
// contention, up to 8 per CPU) and returns it to the system only from the top of a heap, so a
// long-running server whose threads free chunks of many sizes (gRPC messages, tensors, codes)
// holds more pages than it uses, a little more after each burst: the soak measured its producer
// at ~1.2 MB per 1,000 requests, all of it freed memory (malloc_trim gave it back). This returns
// every arena's free pages (malloc_trim(0): MADV_DONTNEED on whole free pages, chunks stay).
// MemoryTrimmer does so on a thread every `interval`, as jemalloc's and tcmalloc's background
// threads return what they hold; the daemons run one (--memory-trim-seconds).
// LimitMallocArenas: glibc gives each new thread an arena of its own until there are 8 per CPU;
// gRPC's pools start threads by demand (more during a fault, when calls block), and every arena
// keeps long-lived chunks scattered over pages of its own that no trim can return. Fewer arenas
// hold the same chunks in fewer pages; the daemons set --malloc-arenas (2).
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

// Resident bytes of `pid` (0: this process) by kind: total = anon + file + shmem. total -1 (the
// rest 0) when it cannot be read.
struct ResidentMemory {
  int64_t total = -1, anon = 0, file = 0, shmem = 0;
};
ResidentMemory ResidentOf(pid_t pid = 0);

// Hands the allocator's free pages back to the system: this process's resident bytes it released
// (before minus after; may be <= 0 when other threads allocated meanwhile).
int64_t ReleaseFreeMemory();

// At most `arenas` (> 0) malloc arenas from now on (arenas already made stay). False when the
// allocator refused (not glibc's).
bool LimitMallocArenas(int arenas);

// Bytes glibc's malloc holds in use for this process: heap chunks and mmapped ones (mallinfo2;
// 0 without glibc's malloc).
int64_t MallocInUseBytes();

// How many arenas glibc's malloc has (its malloc_info report; 0 without glibc's malloc).
int MallocArenas();

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
