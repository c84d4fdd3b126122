#include "proto/registry_client.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/grpc_tls.h"
#include "base/log_text.h"
#include "base/random_id.h"
#include "base/thread_name.h"

namespace scd {
namespace {

void SetDeadline(grpc::ClientContext* context, absl::Duration timeout) {
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

}  // namespace

std::string ShortNodeId(const std::string& node_id) {
  const size_t dash = node_id.find('-');
  return ForLog(node_id.substr(0, dash == std::string::npos ? 8 : dash + 9), 24);
}

void SetNodeIdentity(v1::NodeRole role, const std::string& address, const std::string& model_name,
                     const std::string& fingerprint, v1::RegisterRequest* registration) {
  registration->set_role(role);
  registration->set_address(address);
  v1::ModelEntry* model = registration->add_models();
  model->set_name(model_name);
  model->set_fingerprint(fingerprint);
}

RegistryClient::RegistryClient(std::string coordinator, v1::RegisterRequest registration,
                               LoadFn load, ClusterSecret secret, PrefixBlocksFn prefix_blocks)
    : coordinator_(std::move(coordinator)),
      registration_(std::move(registration)),
      load_(std::move(load)),
      prefix_blocks_(std::move(prefix_blocks)),
      secret_(std::move(secret)),
      stub_(IsEtcdRegistry(coordinator_) ? nullptr
                                         : v1::Registry::NewStub(NewGrpcChannel(coordinator_))) {
  if (IsEtcdRegistry(coordinator_)) {
    absl::StatusOr<EtcdClient> etcd = EtcdClient::Create(coordinator_);
    if (etcd.ok()) {
      etcd_ = *std::move(etcd);
    } else {
      spdlog::error("registry: {}", etcd.status().ToString());  // nodes check it first
    }
  }
}

bool IsEtcdRegistry(const std::string& registry) {
  return absl::StartsWith(registry, "etcd://");
}

absl::Status CheckRegistryAddress(const std::string& registry) {
  if (!IsEtcdRegistry(registry)) return absl::OkStatus();
  return EtcdClient::Create(registry).status();
}

std::string RegistryClient::EtcdEntry(const std::string& node_id) const {
  v1::RegistryEntry entry;
  *entry.mutable_node() = registration_;
  v1::HeartbeatRequest* state = entry.mutable_state();
  state->set_node_id(node_id);
  if (load_) load_(state);
  if (prefix_blocks_) *state->mutable_prefix_blocks() = prefix_blocks_();
  return entry.SerializeAsString();
}

void RegistryClient::LoopEtcd() {
  if (!etcd_) return;
  int64_t lease = 0;
  std::string id, key, written;
  absl::Time kept_alive;
  for (;;) {
    absl::Duration wait = absl::Milliseconds(500);
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      wait = interval_;
    }
    if (lease == 0) {
      wait = absl::Seconds(1);  // retry pace while etcd is unreachable
      absl::StatusOr<int64_t> granted = etcd_->GrantLease(kEtcdLeaseTtl);
      if (granted.ok()) {
        const std::string candidate = absl::StrCat(
            registration_.role() == v1::NODE_ROLE_PRODUCER ? "producer-" : "consumer-",
            RandomId128());
        const std::string entry = EtcdEntry(candidate);
        const absl::Status created =
            etcd_->Create(kEtcdNodesPrefix + candidate, entry, *granted);
        if (created.ok()) {
          lease = *granted;
          id = candidate;
          key = kEtcdNodesPrefix + candidate;
          written = entry;
          kept_alive = absl::Now();
          absl::MutexLock lock(&mu_);
          node_id_ = id;
          etcd_lease_ = lease;
          spdlog::info("registry: registered in etcd {} as {}... (lease {} s)",
                       etcd_->endpoint(), ShortNodeId(id), absl::ToInt64Seconds(kEtcdLeaseTtl));
          continue;
        }
        (void)etcd_->Revoke(*granted);
        spdlog::warn("registry: cannot register in etcd: {}", created.ToString());
      } else {
        spdlog::warn("registry: cannot register in etcd: {}", granted.status().ToString());
      }
    } else {
      const std::string entry = EtcdEntry(id);
      if (entry != written) {
        if (absl::Status put = etcd_->Put(key, entry, lease); put.ok()) {
          written = entry;
        } else {
          spdlog::warn("registry: cannot update {} in etcd: {}", ShortNodeId(id), put.ToString());
        }
      }
      if (absl::Now() - kept_alive >= kEtcdLeaseTtl / 3) {
        const absl::Status alive = etcd_->KeepAlive(lease);
        if (alive.ok()) {
          kept_alive = absl::Now();
        } else if (alive.code() == absl::StatusCode::kNotFound) {
          spdlog::warn("registry: etcd lease of {}... expired; registering again",
                       ShortNodeId(id));
          lease = 0;
          absl::MutexLock lock(&mu_);
          node_id_.clear();
          etcd_lease_ = 0;
          continue;
        } else {
          spdlog::warn("registry: etcd keep-alive failed: {}", alive.ToString());
        }
      }
    }
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), wait);
  }
}

RegistryClient::~RegistryClient() { Stop(); }

void RegistryClient::Start() {
  absl::MutexLock lock(&mu_);
  if (thread_.joinable()) return;
  thread_ = std::thread([this] {
    NameThisThread("scd-registry");
    etcd_ || IsEtcdRegistry(coordinator_) ? LoopEtcd() : Loop();
  });
}

bool RegistryClient::RegisterOnce() {
  grpc::ClientContext context;
  SetDeadline(&context, absl::Seconds(1));
  secret_.Attach(&context);
  v1::RegisterResponse response;
  const grpc::Status status = stub_->Register(&context, registration_, &response);
  if (!status.ok()) {
    spdlog::warn("registry: cannot register at {}: {}", coordinator_, status.error_message());
    return false;
  }
  absl::MutexLock lock(&mu_);
  node_id_ = response.node_id();
  interval_ = absl::Milliseconds(std::max<uint32_t>(50, response.heartbeat_interval_ms()));
  spdlog::info("registry: registered at {} as {}... (lease {} ms)", coordinator_,
               ShortNodeId(node_id_),
               response.lease_ms());
  return true;
}

void RegistryClient::Loop() {
  for (;;) {
    std::string id;
    absl::Duration wait;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      id = node_id_;
      wait = id.empty() ? absl::Milliseconds(200) : interval_;
    }
    if (id.empty()) {
      RegisterOnce();
    } else {
      grpc::ClientContext context;
      SetDeadline(&context, absl::Seconds(1));
      secret_.Attach(&context);
      v1::HeartbeatRequest beat;
      beat.set_node_id(id);
      if (load_) load_(&beat);
      if (prefix_blocks_) *beat.mutable_prefix_blocks() = prefix_blocks_();
      v1::HeartbeatResponse response;
      const grpc::Status status = stub_->Heartbeat(&context, beat, &response);
      if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
        spdlog::warn("registry: lease {}... unknown to the coordinator; registering again",
                     ShortNodeId(id));
        absl::MutexLock lock(&mu_);
        node_id_.clear();
        continue;
      }
      if (!status.ok()) spdlog::warn("registry: heartbeat failed: {}", status.error_message());
    }
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), wait);
  }
}

void RegistryClient::Stop() {
  std::string id;
  int64_t lease = 0;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    id = node_id_;
  }
  if (thread_.joinable()) thread_.join();
  {
    absl::MutexLock lock(&mu_);
    lease = etcd_lease_;
  }
  if (etcd_) {
    // Revoking the lease deletes the node's key: every coordinator's watch drops it at once.
    if (lease != 0) {
      const absl::Status revoked = etcd_->Revoke(lease);
      spdlog::info("registry: left etcd ({}...): {}", ShortNodeId(id),
                   revoked.ok() ? "ok" : revoked.ToString());
    }
    return;
  }
  if (id.empty()) return;
  grpc::ClientContext context;
  SetDeadline(&context, absl::Seconds(1));
  secret_.Attach(&context);
  v1::DeregisterRequest request;
  request.set_node_id(id);
  v1::DeregisterResponse response;
  const grpc::Status status = stub_->Deregister(&context, request, &response);
  spdlog::info("registry: deregistered {}...: {}", ShortNodeId(id),
               status.ok() ? "ok" : status.error_message());
}

std::string RegistryClient::node_id() const {
  absl::MutexLock lock(&mu_);
  return node_id_;
}

bool RegistryClient::WaitRegistered(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto registered = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !node_id_.empty(); };
  return mu_.AwaitWithTimeout(absl::Condition(&registered), timeout);
}

}  // namespace scd
