// Fast ejection (issue 50): a node whose call failed with a connection error (its channel not
// READY: refused, reset, a peer that stopped answering keepalive pings) is out of routing on this
// coordinator at once -- its lease would keep it in for seconds -- and back once its probe (a
// control-plane call the coordinator makes every kProbeInterval while it is out) has passed
// kProbesToReturn times in a row, so a loaded node that answers one probe late does not flap. The
// lease stays the backstop: a node that never answers lapses and leaves the registry. Other
// coordinators keep routing to it on their own evidence (one coordinator's bad link ejects a
// node for that coordinator only).
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
};

// The node's call failed at `now` with a connection error `why`: out (again); the probes passed
// so far are forgotten and the next is due at once.
void Eject(Ejection* e, absl::Time now, std::string why);
// Whether a probe is due at `now` (out, none under way, its time come); if so it is under way
// from now on.
bool TakeProbe(Ejection* e, absl::Time now);
// A probe's answer at `now` (`ok`: the node answered in time): returns true when that brings the
// node back into routing. The next probe is due kProbeInterval later.
bool ProbeAnswered(Ejection* e, bool ok, absl::Time now);

}  // namespace scd::coordinator

#endif  // SCD_COORDINATOR_NODE_EJECTION_H_
