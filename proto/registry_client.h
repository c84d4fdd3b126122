// RegistryClient: how a producer or consumer stays in the coordinator's routing. Registers (and
// retries while the coordinator is unreachable), heartbeats every interval the lease asks for
// (reporting its active requests and the prefix blocks its cache holds), registers again when the coordinator no longer knows the lease
// (it lapsed or the coordinator restarted), and deregisters on Stop, so a drained node leaves
// routing at once rather than after its lease.
// Thread-safety: thread-safe; one background thread between Start and Stop.
#ifndef SCD_PROTO_REGISTRY_CLIENT_H_
#define SCD_PROTO_REGISTRY_CLIENT_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/cluster_secret.h"
#include "scd/v1/registry.grpc.pb.h"

namespace scd {

// A node id ("<role>-" and 32 random hex digits) cut for logs: the role and the first 8 digits,
// escaped. Logs never hold a whole lease id.
std::string ShortNodeId(const std::string& node_id);

// Fills what every registration says of its node: its role, the address its gRPC services answer
// on, and the one model it serves (name, fingerprint). Callers add the rest (transports, transfer
// address, capacity, artifacts).
void SetNodeIdentity(v1::NodeRole role, const std::string& address, const std::string& model_name,
                     const std::string& fingerprint, v1::RegisterRequest* registration);

// The most prefix blocks a heartbeat reports (the most recently used; registry.proto).
inline constexpr size_t kReportedPrefixBlocks = 65536;

class RegistryClient {
 public:
  // What a heartbeat reports of the node's prefix cache (cache-aware routing).
  using PrefixBlocksFn = std::function<v1::PrefixBlocks()>;
  // `coordinator`: its control address. `active_requests` and `prefix_blocks` (may be null: no
  // prefix cache) are sampled at every heartbeat. Every call carries `secret`.
  RegistryClient(std::string coordinator, v1::RegisterRequest registration,
                 std::function<uint32_t()> active_requests, ClusterSecret secret,
                 PrefixBlocksFn prefix_blocks = nullptr);
  ~RegistryClient();  // Stop()

  void Start();
  // Deregisters (best effort, 1 s) and stops heartbeating.
  void Stop();
  // The current lease's node id ("" while unregistered).
  std::string node_id() const;
  // Blocks until registered or `timeout`; false on timeout.
  bool WaitRegistered(absl::Duration timeout) const;

 private:
  void Loop();
  bool RegisterOnce();

  const std::string coordinator_;
  const v1::RegisterRequest registration_;
  const std::function<uint32_t()> active_requests_;
  const PrefixBlocksFn prefix_blocks_;
  const ClusterSecret secret_;
  std::unique_ptr<v1::Registry::Stub> stub_;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::string node_id_ ABSL_GUARDED_BY(mu_);
  absl::Duration interval_ ABSL_GUARDED_BY(mu_) = absl::Milliseconds(500);
  std::thread thread_;
};

}  // namespace scd

#endif  // SCD_PROTO_REGISTRY_CLIENT_H_
