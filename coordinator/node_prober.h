// NodeProber: the coordinator's side of fast ejection (coordinator/node_ejection.h). Every
// kProbeInterval on the registry's clock it asks each node out of routing (or suspect, on another
// coordinator's advice) whose probe is due
// (NodeRegistry::TakeDueProbes) for its Stats on the control plane (Producer.Stats or
// Consumer.Stats with the cluster secret, kProbeTimeout to answer); the answers go back to the
// registry (NoteProbe), which puts a node back into routing after kProbesToReturn in a row. One
// probe per node at a time; nothing is probed while every node is in.
// Thread-safety: thread-safe; the calls are asynchronous (gRPC's callback API, no thread held).
#ifndef SCD_COORDINATOR_NODE_PROBER_H_
#define SCD_COORDINATOR_NODE_PROBER_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>

#include "base/clock.h"
#include "coordinator/node_registry.h"
#include "proto/cluster_secret.h"

namespace scd::coordinator {

class NodeProber {
 public:
  using ChannelFor = std::function<std::shared_ptr<grpc::Channel>(const std::string& address)>;
  // REQUIRES: `registry` and `secret` outlive the prober; `channel` may be called from any
  // thread.
  NodeProber(NodeRegistry* registry, const ClusterSecret* secret, ChannelFor channel);
  // Stops probing; waits for the probes under way to answer (or time out).
  ~NodeProber();
  NodeProber(const NodeProber&) = delete;
  NodeProber& operator=(const NodeProber&) = delete;

 private:
  struct Probe;
  void Tick();

  NodeRegistry* const registry_;
  const ClusterSecret* const secret_;
  const ChannelFor channel_;
  absl::Mutex mu_;
  int running_ ABSL_GUARDED_BY(mu_) = 0;   // probes under way
  std::unique_ptr<Clock::Ticker> ticker_;  // stopped first in the destructor
};

}  // namespace scd::coordinator

#endif  // SCD_COORDINATOR_NODE_PROBER_H_
