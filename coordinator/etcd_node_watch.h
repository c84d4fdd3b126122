// EtcdNodeWatch: a coordinator's routing fed from an etcd registry (--registry etcd://HOST:PORT):
// it reads every node under kEtcdNodesPrefix (proto/registry_client.h), adds them to the
// NodeRegistry (Upsert: liveness is the node's etcd lease, not the coordinator's), then watches
// the prefix: a put adds or updates a node (its load and prefix blocks), a delete — the node
// left, or its process died and its lease expired — removes it from routing at once. When the
// watch breaks (etcd restarted, history compacted) it reads the prefix again, dropping nodes no
// longer there, and watches from that revision. Several coordinators watching one etcd route the
// same nodes. Entries that do not parse or validate are logged and skipped.
// Advice (fast ejection, coordinator/node_ejection.h): each node this coordinator takes out of
// routing on its own evidence is put under kEtcdAdvicePrefix (node id / this coordinator's id,
// the reason as value) with a lease of kEtcdAdviceTtl, from a thread of its own so the ejecting
// call waits for no etcd round trip; the watch covers kEtcdRootPrefix, and another coordinator's
// advice makes the node suspect here (NodeRegistry::NoteAdvice): probed at once, out only if that
// probe fails too. Advice put while the watch was broken is not replayed (it is short-lived; the
// keepalive and the lease still find a dead node).
// Thread-safety: one background thread between Start and the destructor, and one that puts
// advice.
#ifndef SCD_COORDINATOR_ETCD_NODE_WATCH_H_
#define SCD_COORDINATOR_ETCD_NODE_WATCH_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "base/etcd_client.h"
#include "coordinator/node_registry.h"

namespace scd::coordinator {

class EtcdNodeWatch {
 public:
  // INVALID_ARGUMENT for an address that is no etcd://HOST:PORT. REQUIRES: `registry` outlives
  // the watch.
  static absl::StatusOr<std::unique_ptr<EtcdNodeWatch>> Start(const std::string& endpoint,
                                                              NodeRegistry* registry);
  ~EtcdNodeWatch();
  // Blocks until the first read of the prefix succeeded or `timeout`.
  bool WaitSynced(absl::Duration timeout) const;
  // The id this coordinator's advice carries ("coordinator-" and 32 hex digits).
  const std::string& coordinator_id() const { return coordinator_id_; }

 private:
  class AdvicePublisher;
  EtcdNodeWatch(EtcdClient etcd, NodeRegistry* registry);
  void Loop();
  // Reads the prefix into the registry; the revision to watch from (0 on failure).
  int64_t Resync();
  void Apply(const EtcdEvent& event);
  void ApplyAdvice(const EtcdEvent& event);
  // Waits `d` on the registry's clock before trying etcd again, or until the destructor.
  void Backoff(absl::Duration d);

  const EtcdClient etcd_;
  NodeRegistry* const registry_;
  const std::string coordinator_id_;
  std::shared_ptr<AdvicePublisher> publisher_;  // shared with the registry's listener
  std::atomic<bool> stop_{false};  // what EtcdClient::Watch looks at
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;  // stop_, for the waits
  bool synced_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace scd::coordinator

#endif  // SCD_COORDINATOR_ETCD_NODE_WATCH_H_
