#include "base/change_notice.h"

#include <atomic>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace scd {
namespace {

// A waiter registers in `waiters` under `mu` before it reads the count; NoteChange adds to the
// count before it reads `waiters` (both sequentially consistent), so either the waiter sees the
// new count or NoteChange sees the waiter and passes through `mu`, which makes the waiter's
// Condition be evaluated again.
std::atomic<uint64_t> changes{0};
std::atomic<int> waiters{0};

absl::Mutex& WaitMutex() {
  static absl::Mutex* mu = new absl::Mutex;
  return *mu;
}

}  // namespace

void NoteChange() {
  changes.fetch_add(1);
  if (waiters.load() > 0) {
    absl::MutexLock pass(&WaitMutex());  // an empty pass: the waiters' Conditions run again
  }
}

uint64_t ChangeCount() { return changes.load(); }

uint64_t AwaitChangeAfter(uint64_t after, absl::Time deadline, Clock* clock) {
  absl::Mutex& mu = WaitMutex();
  absl::MutexLock lock(&mu);
  waiters.fetch_add(1);
  auto moved = [after] { return changes.load() > after; };
  clock->AwaitWithDeadline(&mu, absl::Condition(&moved), deadline);
  waiters.fetch_sub(1);
  return changes.load();
}

bool AwaitChange(const std::function<bool()>& holds, absl::Time deadline, Clock* clock) {
  for (;;) {
    const uint64_t seen = ChangeCount();  // before the read: a change after it wakes the wait
    if (holds()) return true;
    if (AwaitChangeAfter(seen, deadline, clock) <= seen) return holds();
  }
}

}  // namespace scd
