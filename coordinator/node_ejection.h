// Fast ejection (issue 50): a node whose call failed with a connection error (its channel not
// READY: refused, reset, a peer that stopped answering keepalive pings) is out of routing on this
// coordinator at once -- its lease would keep it in for seconds -- and back once its probe (a
// control-plane call the coordinator makes every kProbeInterval while it is out) has passed
// kProbesToReturn times in a row, so a loaded node that answers one probe late does not flap. The
// lease stays the backstop: a node that never answers lapses and leaves the registry.
// Advice: a coordinator that ejects a node tells the others (etcd, coordinator/etcd_node_watch.h)
// and they check it with their own probe at once: the node stays in their routing meanwhile
// (*suspect*), a failed probe ejects it there too, a passing one clears it. So a frozen node
// leaves every coordinator's routing within a probe of the first one's evidence, and one
// coordinator with a bad link ejects a healthy node for itself only.
// Thread-safety: plain data and pure functions; the registry's lock guards each node's state.
#ifndef SCD_COORDINATOR_NODE_EJECTION_H_
#define SCD_COORDINATOR_NODE_EJECTION_H_

#include <string>

#include "absl/time/time.h"

namespace scd::coordinator {

inline constexpr int kProbesToReturn = 2;
// The coordinator's connections to its nodes ping every kNodeKeepalive and give up on a node that
// has not answered a ping for kNodeKeepaliveTimeout (a frozen process, a silent link): every call
// on that connection ends UNAVAILABLE, which ejects the node -- within 1.5 s of its last answer,
// inside the 2 s the issue allows. The nodes' servers accept pings at that rate
// (proto/grpc_server.h kMinPingIntervalMs).
inline constexpr absl::Duration kNodeKeepalive = absl::Milliseconds(500);
inline constexpr absl::Duration kNodeKeepaliveTimeout = absl::Milliseconds(1000);
inline constexpr absl::Duration kProbeInterval = absl::Milliseconds(200);
// A probe that has not answered by then counts as failed.
inline constexpr absl::Duration kProbeTimeout = absl::Milliseconds(500);

struct Ejection {
  bool out = false;
  absl::Time since = absl::InfinitePast();  // when it went out
  std::string why;
  int passes = 0;                                // probes passed in a row since
  absl::Time next_probe = absl::InfinitePast();  // when the next probe is due
  bool probing = false;                          // a probe is under way
  int ejections = 0;                             // times it went out (logs, tests)
  bool suspect = false;  // in routing, another coordinator ejected it: its probe will tell
};

// What a probe's answer did.
enum class ProbeOutcome {
  kNone,     // nothing changed (still out, or an answer for a node in routing and not suspect)
  kBack,     // out, and now back in routing (kProbesToReturn passes in a row)
  kCleared,  // suspect, and the probe passed: in routing, no longer suspect
  kEjected,  // suspect, and the probe failed: out from now on
};

// The node's call failed at `now` with a connection error `why`: out (again); the probes passed
// so far are forgotten and the next is due at once.
void Eject(Ejection* e, absl::Time now, std::string why);
// Another coordinator ejected the node: unless it is out here already, it is suspect and its
// probe is due at once. Returns whether it became suspect now.
bool Advise(Ejection* e, absl::Time now);
// Whether a probe is due at `now` (out or suspect, none under way, its time come); if so it is
// under way from now on.
bool TakeProbe(Ejection* e, absl::Time now);
// A probe's answer at `now` (`ok`: the node answered in time). The next probe is due
// kProbeInterval later. A suspect node's failed probe ejects it with `why`.
ProbeOutcome ProbeAnswered(Ejection* e, bool ok, absl::Time now,
                           const std::string& why = "its probe failed");

}  // namespace scd::coordinator

#endif  // SCD_COORDINATOR_NODE_EJECTION_H_
