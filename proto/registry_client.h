// RegistryClient: how a producer or consumer stays in the coordinator's routing. Registers (and
// retries while the coordinator is unreachable), heartbeats every interval the lease asks for
// (reporting its load and the prefix blocks its cache holds), registers again when the coordinator no longer knows the lease
// (it lapsed or the coordinator restarted), and deregisters on Stop, so a drained node leaves
// routing at once rather than after its lease.
// With an etcd registry (`coordinator` = "etcd://HOST:PORT", the nodes' --registry): the node
// puts a RegistryEntry (registry.proto) under kEtcdNodesPrefix + a node id it makes
// ("<role>-" and 32 random hex digits, created only if no such key exists: globally unique),
// under an etcd lease of kEtcdLeaseTtl that it keeps alive every third of it; it rewrites the
// entry when its load or prefix blocks change (at most every heartbeat interval) and revokes the
// lease on Stop (the key goes at once); a process that dies leaves routing when the lease
// expires. Every coordinator watching the prefix routes to it (coordinator/etcd_node_watch.h).
// Thread-safety: thread-safe; one background thread between Start and Stop.
#ifndef SCD_PROTO_REGISTRY_CLIENT_H_
#define SCD_PROTO_REGISTRY_CLIENT_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/etcd_client.h"
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

inline constexpr char kEtcdNodesPrefix[] = "/scd/v1/nodes/";
// Fast ejection's advice between coordinators (coordinator/etcd_node_watch.h): a coordinator that
// took a node out of routing puts kEtcdAdvicePrefix + node id + "/" + its own id, the reason as
// the value, under a lease of kEtcdAdviceTtl; every coordinator watches kEtcdRootPrefix.
inline constexpr char kEtcdRootPrefix[] = "/scd/v1/";
inline constexpr char kEtcdAdvicePrefix[] = "/scd/v1/advice/";
inline constexpr absl::Duration kEtcdAdviceTtl = absl::Seconds(5);
inline constexpr absl::Duration kEtcdLeaseTtl = absl::Seconds(10);
// "etcd://..." names an etcd registry.
bool IsEtcdRegistry(const std::string& registry);
// INVALID_ARGUMENT for an etcd registry address that is no etcd://HOST:PORT.
absl::Status CheckRegistryAddress(const std::string& registry);

class RegistryClient {
 public:
  // What a heartbeat reports of the node's prefix cache (cache-aware routing).
  using PrefixBlocksFn = std::function<v1::PrefixBlocks()>;
  // What a heartbeat reports of the node's load: active requests; a consumer's reserved and
  // queued KV bytes.
  using LoadFn = std::function<void(v1::HeartbeatRequest*)>;
  // `coordinator`: its control address. `load` and `prefix_blocks` (may be null: no prefix
  // cache) are sampled at every heartbeat. Every call carries `secret`.
  RegistryClient(std::string coordinator, v1::RegisterRequest registration, LoadFn load,
                 ClusterSecret secret, PrefixBlocksFn prefix_blocks = nullptr);
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
  void LoopEtcd();
  // The entry the node's etcd key holds now.
  std::string EtcdEntry(const std::string& node_id) const;

  const std::string coordinator_;
  const v1::RegisterRequest registration_;
  const LoadFn load_;
  const PrefixBlocksFn prefix_blocks_;
  const ClusterSecret secret_;
  std::unique_ptr<v1::Registry::Stub> stub_;
  std::optional<EtcdClient> etcd_;  // set for an etcd registry
  int64_t etcd_lease_ ABSL_GUARDED_BY(mu_) = 0;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::string node_id_ ABSL_GUARDED_BY(mu_);
  absl::Duration interval_ ABSL_GUARDED_BY(mu_) = absl::Milliseconds(500);
  std::thread thread_;
};

}  // namespace scd

#endif  // SCD_PROTO_REGISTRY_CLIENT_H_
