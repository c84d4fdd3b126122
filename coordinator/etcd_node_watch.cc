#include "coordinator/etcd_node_watch.h"

#include <spdlog/spdlog.h>

#include <set>

#include "absl/time/clock.h"
#include "base/log_text.h"
#include "base/thread_name.h"
#include "proto/registry_client.h"

namespace scd::coordinator {
namespace {

std::string NodeIdOf(const std::string& key) { return key.substr(std::strlen(kEtcdNodesPrefix)); }

}  // namespace

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

void EtcdNodeWatch::Apply(const EtcdEvent& event) {
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
        kEtcdNodesPrefix, next,
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
