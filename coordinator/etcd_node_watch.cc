#include "coordinator/etcd_node_watch.h"

#include <spdlog/spdlog.h>

#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/log_text.h"
#include "base/random_id.h"
#include "base/thread_name.h"
#include "base/work_queue.h"
#include "proto/registry_client.h"

namespace scd::coordinator {
namespace {

std::string NodeIdOf(const std::string& key) { return key.substr(std::strlen(kEtcdNodesPrefix)); }

constexpr size_t kMaxAdviceReason = 300;

}  // namespace

// Puts this coordinator's advice from a thread of its own; once stopped, what is still queued is
// dropped (a coordinator going away has nothing to advise).
class EtcdNodeWatch::AdvicePublisher {
 public:
  AdvicePublisher(EtcdClient etcd, std::string coordinator_id)
      : etcd_(std::move(etcd)), coordinator_id_(std::move(coordinator_id)) {}
  void Stop() { stopped_ = true; }
  void Publish(const std::string& node_id, const std::string& why) {
    queue_.Run([this, node_id, why = why.substr(0, kMaxAdviceReason)] {
      if (stopped_.load()) return;
      const std::string key = absl::StrCat(kEtcdAdvicePrefix, node_id, "/", coordinator_id_);
      absl::StatusOr<int64_t> lease = etcd_.GrantLease(kEtcdAdviceTtl);
      absl::Status put = lease.ok() ? etcd_.Put(key, why, *lease) : lease.status();
      if (!put.ok()) {
        spdlog::warn("registry: cannot advise the other coordinators of {}: {}",
                     ShortNodeId(node_id), put.ToString());
      }
    });
  }

 private:
  const EtcdClient etcd_;
  const std::string coordinator_id_;
  std::atomic<bool> stopped_{false};
  WorkQueue queue_{1, "scd-etcd-advice"};  // last: joined first
};

EtcdNodeWatch::EtcdNodeWatch(EtcdClient etcd, NodeRegistry* registry)
    : etcd_(std::move(etcd)),
      registry_(registry),
      coordinator_id_(absl::StrCat("coordinator-", RandomId128())),
      publisher_(std::make_shared<AdvicePublisher>(etcd_, coordinator_id_)) {
  registry_->SetEjectionListener(
      [publisher = publisher_](const std::string& node_id, const std::string& why) {
        publisher->Publish(node_id, why);
      });
}

absl::StatusOr<std::unique_ptr<EtcdNodeWatch>> EtcdNodeWatch::Start(const std::string& endpoint,
                                                                    NodeRegistry* registry) {
  absl::StatusOr<EtcdClient> etcd = EtcdClient::Create(endpoint);
  if (!etcd.ok()) return etcd.status();
  std::unique_ptr<EtcdNodeWatch> watch(new EtcdNodeWatch(*std::move(etcd), registry));
  EtcdNodeWatch* self = watch.get();
  watch->thread_ = std::thread([self] {
    NameThisThread("scd-etcd-watch");
    self->Loop();
  });
  return watch;
}

EtcdNodeWatch::~EtcdNodeWatch() {
  registry_->SetEjectionListener(nullptr);  // a call under way holds the publisher
  publisher_->Stop();
  stop_ = true;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

bool EtcdNodeWatch::WaitSynced(absl::Duration timeout) const {
  Clock* clock = registry_->clock();
  absl::MutexLock lock(&mu_);
  return clock->AwaitWithDeadline(&mu_, absl::Condition(&synced_), clock->Now() + timeout);
}

void EtcdNodeWatch::Backoff(absl::Duration d) {
  Clock* clock = registry_->clock();
  absl::MutexLock lock(&mu_);
  clock->AwaitWithDeadline(&mu_, absl::Condition(&stopping_), clock->Now() + d);
}

void EtcdNodeWatch::ApplyAdvice(const EtcdEvent& event) {
  if (event.type != EtcdEvent::Type::kPut) return;  // lapsed: the probes have said their piece
  const std::string rest = event.kv.key.substr(std::strlen(kEtcdAdvicePrefix));
  const size_t slash = rest.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == rest.size()) {
    spdlog::warn("registry: etcd key {} is no advice (node/coordinator); skipped",
                 ForLog(event.kv.key, 80));
    return;
  }
  const std::string from = rest.substr(slash + 1);
  if (from == coordinator_id_) return;  // this coordinator's own
  registry_->NoteAdvice(rest.substr(0, slash), from, event.kv.value.substr(0, kMaxAdviceReason));
}

void EtcdNodeWatch::Apply(const EtcdEvent& event) {
  if (absl::StartsWith(event.kv.key, kEtcdAdvicePrefix)) return ApplyAdvice(event);
  if (!absl::StartsWith(event.kv.key, kEtcdNodesPrefix)) return;  // another kind of key
  const std::string id = NodeIdOf(event.kv.key);
  if (event.type == EtcdEvent::Type::kDelete) {
    if (registry_->Deregister(id).ok()) {
      spdlog::info("registry: {}... left (etcd)", ShortNodeId(id));
    }
    return;
  }
  v1::RegistryEntry entry;
  if (!entry.ParseFromString(event.kv.value)) {
    spdlog::warn("registry: etcd key {} holds no RegistryEntry; skipped", ForLog(event.kv.key, 80));
    return;
  }
  if (absl::Status added = registry_->Upsert(id, entry.node(), entry.state()); !added.ok()) {
    spdlog::warn("registry: etcd node {}... refused: {}", ShortNodeId(id), added.ToString());
  }
}

int64_t EtcdNodeWatch::Resync() {
  int64_t revision = 0;
  absl::StatusOr<std::vector<EtcdKeyValue>> nodes = etcd_.Range(kEtcdNodesPrefix, &revision);
  if (!nodes.ok()) {
    spdlog::warn("registry: cannot read etcd {}: {}", etcd_.endpoint(), nodes.status().ToString());
    return 0;
  }
  std::set<std::string> present;
  for (const EtcdKeyValue& kv : *nodes) {
    present.insert(NodeIdOf(kv.key));
    Apply(EtcdEvent{EtcdEvent::Type::kPut, kv});
  }
  for (const std::string& id : registry_->ExternalNodeIds()) {
    if (present.count(id) == 0) (void)registry_->Deregister(id);
  }
  absl::MutexLock lock(&mu_);
  synced_ = true;
  return revision;
}

void EtcdNodeWatch::Loop() {
  int64_t next = 0;  // the revision to watch from; 0: read the prefix first
  while (!stop_.load()) {
    if (next == 0) {
      const int64_t revision = Resync();
      if (revision == 0) {
        Backoff(absl::Milliseconds(500));
        continue;
      }
      next = revision + 1;
    }
    const absl::Status watched = etcd_.Watch(
        kEtcdRootPrefix, next,
        [&](const std::vector<EtcdEvent>& events) {
          for (const EtcdEvent& event : events) {
            Apply(event);
            next = std::max(next, event.kv.mod_revision + 1);
          }
        },
        stop_);
    if (stop_.load()) break;
    if (watched.code() == absl::StatusCode::kDeadlineExceeded) continue;  // quiet: watch again
    spdlog::warn("registry: etcd watch ended ({}); reading the nodes again", watched.ToString());
    next = 0;
    Backoff(absl::Milliseconds(200));
  }
}

}  // namespace scd::coordinator
