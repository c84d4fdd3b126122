// Faults replayed by the cluster simulator (issue 51): the soak's freeze of a node
// (bench/soak_faults.h: SIGSTOP for `hold`, then SIGCONT) and its kill (kill -9, restarted) on
// simulated time. A frozen node computes nothing, sends no heartbeat and takes no call: its work
// in flight stops and goes on at the thaw (a step ends that much later, a producer's passes make
// no progress), and the calls and codes that reach it wait in its sockets until then. A killed
// node's work is lost and its connections reset; it is down until its restart is ready.
// FrozenSpans is a node's freezes (or times down) and the arithmetic of work around them;
// KeepaliveGivesUp when a connection to a frozen node declares it dead. The cluster's answer to
// both is bench/sim_failover.cc's. The soak's other faults (a flap; etcd's restart; a coordinator
// replaced; a link down) are not simulated yet: bench/sim_config.h refuses them naming the fault.
// Thread-safety: a value.
#ifndef SCD_BENCH_SIM_FAULTS_H_
#define SCD_BENCH_SIM_FAULTS_H_

#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace scd::bench {

class FrozenSpans {
 public:
  // Adds the freeze [from, to); INVALID_ARGUMENT when it is empty or overlaps one added before.
  absl::Status Add(absl::Time from, absl::Time to);
  bool empty() const { return spans_.empty(); }
  // The end of the freeze holding `t`, or `t` when none does (a span holds its start, not its end).
  absl::Time ThawOf(absl::Time t) const;
  bool Frozen(absl::Time t) const { return ThawOf(t) > t; }
  // When work of `work` starting at `start` ends, the node computing only outside the freezes.
  absl::Time EndOf(absl::Time start, absl::Duration work) const;
  // The time in [from, to) outside the freezes.
  absl::Duration Active(absl::Time from, absl::Time to) const;

 private:
  std::vector<std::pair<absl::Time, absl::Time>> spans_;  // sorted, disjoint
};

// When a connection that pings its peer every `interval` (pings on a grid from `grid_start`)
// and declares it dead after `timeout` without an answer gives up on a peer frozen over
// [from, to): the first ping sent into the freeze goes unanswered until the thaw, so the deadline
// is that ping's plus `timeout` -- none when the thaw answers it in time (gRPC's keepalive; its
// timer, reset by traffic in newer releases, taken as a fixed grid).
std::optional<absl::Time> KeepaliveGivesUp(absl::Time grid_start, absl::Duration interval,
                                           absl::Duration timeout, absl::Time from, absl::Time to);

}  // namespace scd::bench

#endif  // SCD_BENCH_SIM_FAULTS_H_
