// When this process last let go of something a request held: an admission slot and its KV
// reservation, a scheduler's sequence, a transfer session, a producer's prefill, a coordinator's
// routed request. Every place that frees such a thing calls NoteRelease(); a node's Stats report
// the time (NodeStats.last_release_unix_micros), so a test dates a cancel's release exactly -- by
// the node's own clock at the moment it freed the last thing -- instead of by how soon a poll of
// its counters happens to see it (tests/cancel_latency_test.cc). One value per process: nodes that
// share a process (in-process test stacks) share it.
// Thread-safety: both functions may be called from any thread at any time (one atomic).
#ifndef SCD_BASE_RELEASE_CLOCK_H_
#define SCD_BASE_RELEASE_CLOCK_H_

#include <cstdint>

namespace scd {

// Stamps now (the wall clock, Unix microseconds) as the latest release; never moves backwards.
// Counts a change too (base/change_notice.h).
void NoteRelease();

// The latest stamp, Unix microseconds; 0 before the first release.
int64_t LastReleaseUnixMicros();

}  // namespace scd

#endif  // SCD_BASE_RELEASE_CLOCK_H_
