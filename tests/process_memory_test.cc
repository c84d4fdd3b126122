// ResidentBytes reads VmRSS (checked against pages this test touches), ResidentOf splits it by
// kind; memory freed below a live
// chunk stays resident under glibc's malloc -- the long-running daemons' slow RSS growth -- until
// ReleaseFreeMemory, which the MemoryTrimmer runs on its own thread.
#include "base/process_memory.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

namespace scd {
namespace {

constexpr int64_t kMiB = 1 << 20;

#if defined(__SANITIZE_ADDRESS__)
#define SCD_SKIP_WITHOUT_GLIBC_MALLOC() GTEST_SKIP() << "a sanitizer's allocator, not glibc's"
#else
#define SCD_SKIP_WITHOUT_GLIBC_MALLOC() (void)0
#endif

// 64 MiB in 64 KiB blocks (under glibc's mmap threshold: they come from the heap), every page
// touched; the block at the highest address stays (the pin) and keeps the freed ones below the
// heap's top, where free() cannot hand them back.
struct Fragmented {
  std::vector<void*> blocks;
  void* pin = nullptr;
  Fragmented() {
    for (int i = 0; i < 1025; ++i) {
      blocks.push_back(std::malloc(64 << 10));
      std::memset(blocks.back(), 1, 64 << 10);
    }
    std::sort(blocks.begin(), blocks.end());
    pin = blocks.back();
    blocks.pop_back();
  }
  void FreeBlocks() {
    for (void* b : blocks) std::free(b);
    blocks.clear();
  }
  ~Fragmented() {
    FreeBlocks();
    std::free(pin);
  }
};

TEST(ProcessMemoryTest, ResidentBytesCountsTouchedPages) {
  ASSERT_GT(ResidentBytes(), 0);
  EXPECT_GT(ResidentBytes(getpid()), 0);
  EXPECT_EQ(ResidentBytes(999'999'999), -1);  // no such process
  const int64_t before = ResidentBytes();
  std::vector<char> pages(32 * kMiB, 1);
  EXPECT_GE(ResidentBytes() - before, 30 * kMiB);
}

// ResidentOf splits VmRSS by kind: touched heap pages are anonymous, the program's code
// file-backed.
TEST(ProcessMemoryTest, ResidentOfSplitsAnonymousFromFileBackedPages) {
  const ResidentMemory now = ResidentOf();
  ASSERT_GT(now.total, 0);
  EXPECT_EQ(now.total, now.anon + now.file + now.shmem);  // one read of /proc/self/status
  EXPECT_GT(now.file, 0);                                 // this program's own code at least
  EXPECT_EQ(ResidentOf(999'999'999).total, -1);
  const ResidentMemory before = ResidentOf();
  std::vector<char> pages(32 * kMiB, 1);
  const ResidentMemory after = ResidentOf();
  EXPECT_GE(after.anon - before.anon, 30 * kMiB);
  EXPECT_LT(after.file - before.file, 2 * kMiB);
}

TEST(ProcessMemoryTest, MallocInUseBytesCountsWhatIsAllocated) {
  SCD_SKIP_WITHOUT_GLIBC_MALLOC();
  const int64_t before = MallocInUseBytes();
  auto* chunk = new std::vector<char>(8 * kMiB, 1);
  const int64_t held = MallocInUseBytes() - before;
  delete chunk;
  EXPECT_GE(held, 8 * kMiB);
  EXPECT_LT(held, 8 * kMiB + 64 * 1024);
  EXPECT_LT(MallocInUseBytes() - before, 64 * 1024);
}

TEST(ProcessMemoryTest, FreedMemoryBelowALiveChunkStaysResidentUntilReleased) {
  SCD_SKIP_WITHOUT_GLIBC_MALLOC();
  ReleaseFreeMemory();
  const int64_t base = ResidentBytes();
  Fragmented heap;
  heap.FreeBlocks();
  ASSERT_GE(ResidentBytes() - base, 56 * kMiB) << "glibc gave the freed blocks back by itself";
  EXPECT_GE(ReleaseFreeMemory(), 56 * kMiB);
  EXPECT_LE(ResidentBytes() - base, 8 * kMiB);
}

TEST(ProcessMemoryTest, TheTrimmerReleasesOnItsOwnThreadEveryInterval) {
  SCD_SKIP_WITHOUT_GLIBC_MALLOC();
  ReleaseFreeMemory();
  const int64_t base = ResidentBytes();
  MemoryTrimmer trimmer(absl::Milliseconds(50));
  Fragmented heap;
  const uint64_t trims = trimmer.trims();
  heap.FreeBlocks();
  const absl::Time limit = absl::Now() + absl::Seconds(10);
  while ((trimmer.trims() < trims + 2 || ResidentBytes() - base > 8 * kMiB) &&
         absl::Now() < limit) {
    // waits: the trimmer's own timer to run twice (it exposes a count, no event: a test-only wait
    //  in a library is what the issue forbids)
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_LE(ResidentBytes() - base, 8 * kMiB);
  EXPECT_GE(trimmer.released_bytes(), 56 * kMiB);
}

// Eight threads allocating at once would get an arena each (glibc: up to 8 per CPU); limited,
// they share what is there plus one.
TEST(ProcessMemoryTest, LimitedArenasAreSharedByNewThreads) {
  SCD_SKIP_WITHOUT_GLIBC_MALLOC();
  const int before = MallocArenas();
  ASSERT_GE(before, 1);
  ASSERT_TRUE(LimitMallocArenas(before + 1));
  absl::Mutex mu;
  int started = 0;
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&] {
      void* chunk = std::malloc(1 << 20);  // the thread's first allocation picks its arena
      std::memset(chunk, 1, 1 << 20);
      absl::MutexLock lock(&mu);
      ++started;
      mu.Await(absl::Condition(
          +[](int* n) { return *n == 8; }, &started));  // all hold one
      std::free(chunk);
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_LE(MallocArenas(), before + 1);
  EXPECT_FALSE(LimitMallocArenas(0));
}

TEST(ProcessMemoryTest, TheTrimmerStopsAtOnce) {
  const absl::Time start = absl::Now();
  { MemoryTrimmer trimmer(absl::Hours(1)); }
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
}

}  // namespace
}  // namespace scd
