// ChangeNotice: a process-wide count of changes to what requests hold -- taken or let go: an
// admission slot or queue place, a scheduler's sequence, a transfer session, connection or
// buffer, a producer's prefill and the code bytes it holds, a coordinator's routed request or
// registered node. Each place that changes such a thing calls NoteChange() once the change is
// visible to readers; whoever must act when the state differs from what it last saw (a node's Stats
// long-poll, serving/stats_wait.h; in-process tests) waits for the count to pass the value it read
// instead of polling. The count says only that something changed: the waiter reads the state again
// and decides. One count per process: nodes that share a process (in-process test stacks) share it.
// Thread-safety: every function may be called from any thread; NoteChange is one atomic add
// (and a lock only while someone waits).
#ifndef SCD_BASE_CHANGE_NOTICE_H_
#define SCD_BASE_CHANGE_NOTICE_H_

#include <cstdint>
#include <functional>

#include "absl/time/time.h"
#include "base/clock.h"

namespace scd {

// Counts one change and wakes the waiters.
void NoteChange();

// Changes counted so far in this process.
uint64_t ChangeCount();

// Waits until ChangeCount() > `after` or `clock` reaches `deadline`; returns the count then (the
// caller compares it with `after`).
uint64_t AwaitChangeAfter(uint64_t after, absl::Time deadline, Clock* clock = Clock::Real());

// Waits until `holds()` is true, reading it again after every change, or until `clock` reaches
// `deadline`; returns whether it held. `holds` must read state whose changes are noted.
bool AwaitChange(const std::function<bool()>& holds, absl::Time deadline,
                 Clock* clock = Clock::Real());

}  // namespace scd

#endif  // SCD_BASE_CHANGE_NOTICE_H_
