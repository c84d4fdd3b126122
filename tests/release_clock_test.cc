#include "base/release_clock.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "absl/time/clock.h"

namespace scd {
namespace {

// The stamp falls between the wall-clock readings taken around the release, and a later release
// moves it on.
TEST(ReleaseClockTest, StampsTheMomentOfTheLatestRelease) {
  const int64_t before = absl::ToUnixMicros(absl::Now());
  NoteRelease();
  const int64_t first = LastReleaseUnixMicros();
  const int64_t after = absl::ToUnixMicros(absl::Now());
  EXPECT_GE(first, before);
  EXPECT_LE(first, after);
  // paces: the wall clock must move for the stamp to (the code under test reads it)
  absl::SleepFor(absl::Milliseconds(2));
  NoteRelease();
  EXPECT_GE(LastReleaseUnixMicros(), first + 2000);
}

// Releases from many threads at once leave the latest of their stamps (never an older one).
TEST(ReleaseClockTest, ConcurrentReleasesKeepTheLatest) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([] {
      for (int i = 0; i < 10000; ++i) NoteRelease();
    });
  }
  for (std::thread& t : threads) t.join();
  const int64_t after = absl::ToUnixMicros(absl::Now());
  const int64_t stamp = LastReleaseUnixMicros();
  EXPECT_LE(stamp, after);
  EXPECT_GE(stamp, after - 1000000);  // within the last second: the latest, not the first
}

}  // namespace
}  // namespace scd
