#include "base/release_clock.h"

#include <atomic>

#include "absl/time/clock.h"
#include "base/change_notice.h"

namespace scd {
namespace {

std::atomic<int64_t> last_release_micros{0};

}  // namespace

void NoteRelease() {
  const int64_t now = absl::ToUnixMicros(absl::Now());
  int64_t seen = last_release_micros.load(std::memory_order_relaxed);
  while (seen < now &&
         !last_release_micros.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
  }
  NoteChange();
}

int64_t LastReleaseUnixMicros() { return last_release_micros.load(std::memory_order_relaxed); }

}  // namespace scd
