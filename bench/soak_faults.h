// The fault schedule of `scd-bench soak` (bench/soak.h) and its execution against a
// SoakDeployment, with each fault's recovery measured:
//   kill     kill -9 of a node; a consumer or the producer is then waited out of routing (its
//            etcd lease lapses: bound lease + 3 s), every node restarted; bound: serving again
//            within 5 s of being ready
//   freeze   SIGSTOP for `hold`, then SIGCONT; bound: serving within 5 s of the SIGCONT
//   flap     every producer's link shaped to a trickle for `hold` (Registry.SetLinkShape), then
//            unshaped; bound: a transfer served within 5 s of the restore
//   etcd     etcd killed (-9) for `hold`, then restarted on its data; bound: every node routed by
//            every coordinator and served within 5 s of etcd being ready
//   replace  a coordinator replaced while streams are open: a new one started, the old one
//            drained by SIGTERM; bound: the new one serving within 5 s of being ready
//   link-down  the producer's own link (SoakDeployment::SetProducerLinkUp, a network namespace)
//            down for `hold`, then up: packets lost both ways; bound: as the producer's freeze
// A consumer, a coordinator or the producer is killed or frozen while it holds a stream or a
// transfer (the fault waits up to 8 s for one, polling Stats or Health), so that streams must
// move, resume or fall back.
// "Serving" is checked by probes: small requests through the coordinators (and, for a consumer,
// straight to the node) that must finish.
// Thread-safety: RunSoakFault only from the thread that started the deployment.
#ifndef SCD_BENCH_SOAK_FAULTS_H_
#define SCD_BENCH_SOAK_FAULTS_H_

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "bench/soak_deployment.h"

namespace scd::bench {

enum class FaultKind { kKill, kFreeze, kFlap, kEtcd, kReplace, kLinkDown };
const char* FaultKindName(FaultKind kind);
// What every schedule runs; kLinkDown besides where the producer has a link of its own.
inline constexpr FaultKind kAllFaultKinds[] = {
    FaultKind::kKill, FaultKind::kFreeze, FaultKind::kFlap, FaultKind::kEtcd, FaultKind::kReplace};

struct SoakFault {
  FaultKind kind = FaultKind::kKill;
  int node = -1;  // the deployment's node index (kill, freeze, replace, link-down; etcd: etcd's)
  absl::Duration hold = absl::Seconds(3);  // freeze, flap, etcd down
  // A consumer's or coordinator's kill or freeze: the nodes it may go to instead of `node` (the
  // replicas of its model, the coordinators; `node` among them), the one that holds streams
  // when it comes. Empty: `node`.
  std::vector<int> either;
};

// The faults of cycle `cycle`: the first runs every kind and kills and freezes every role once
// (consumer, producer, coordinator); later ones kill one node and freeze another in turn, flap
// the link, restart etcd, freeze the producer, freeze a replica of a replicated
// target twice, every third replaces a coordinator and the one after kills a coordinator. A kill
// or freeze of a consumer, coordinator or the producer first waits up to 2 s for two streams
// there (on any node of `either`), then up to 2 s for one (FaultOutcome::mid_stream): routing
// sends most streams to one replica, whichever the turn names.
// `link_down`: every cycle also takes the producer's link down and up (the deployment runs it in
// a namespace of its own).
std::vector<SoakFault> SoakFaultCycle(const std::vector<SoakNode>& nodes, int cycle,
                                      bool link_down = false);

struct FaultOutcome {
  SoakFault fault;
  std::string node;  // name, "" for a flap
  SoakRole role = SoakRole::kEtcd;
  std::string model;     // a consumer's routing name
  std::string address;   // the faulted process's public address (a coordinator's: its clients')
  absl::Time start;      // the fault began
  absl::Time acted;      // the node was ready again / thawed / the link restored
  absl::Time recovered;  // serving again (InfinitePast: never, within the wait)
  double out_of_routing_s = -1;  // kill of a consumer or the producer: kill -> no coordinator
                                 // routes to it
  double out_of_routing_bound_s = 0;
  double recovery_s = -1;  // acted -> recovered
  double recovery_bound_s = 5;
  bool mid_stream = false;  // the node held a stream when it was faulted
  std::string error;        // what failed (a restart, a probe never succeeding)
  bool ok() const;
};

// Runs `fault` and waits for recovery (at most `max_wait` for each wait).
FaultOutcome RunSoakFault(SoakDeployment& deployment, const SoakFault& fault,
                          const std::vector<std::string>& targets,
                          absl::Duration max_wait = absl::Seconds(30));

// A probe: `target` asked through `server` in `mode` (max 2 tokens, 3 s) finishes.
bool Probe(const std::string& server, const std::string& target, const std::string& mode);

}  // namespace scd::bench

#endif  // SCD_BENCH_SOAK_FAULTS_H_
