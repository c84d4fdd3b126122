#include "coordinator/node_registry.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/change_notice.h"
#include "base/log_text.h"
#include "base/random_id.h"
#include "proto/wire_mode.h"

namespace scd::coordinator {

NodeRegistry::NodeRegistry(RegistryOptions options, Clock* clock)
    : options_(options), clock_(clock), links_(options.learnt_link_max_age) {}

absl::StatusOr<Lease> NodeRegistry::Register(const v1::RegisterRequest& request) {
  if (absl::Status valid = ValidateRegistration(request, options_.tokenizer_fingerprint);
      !valid.ok()) {
    return valid;
  }
  absl::MutexLock lock(&mu_);
  const std::string id = absl::StrCat(RoleName(request.role()), "-", RandomId128());
  if (request.role() == v1::NODE_ROLE_CONSUMER) {
    for (const v1::ModelEntry& model : request.models()) known_targets_.insert(model.name());
  }
  nodes_.emplace(id, NodeOf(id, request, clock_->Now()));
  NoteChange();
  return Lease{id, options_.lease, options_.heartbeat_interval};
}

absl::Status NodeRegistry::Heartbeat(const v1::HeartbeatRequest& request) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(request.node_id());
  const absl::Time now = clock_->Now();
  if (it == nodes_.end() || !Live(it->second, now, options_.lease)) {
    return absl::NotFoundError(absl::StrCat("heartbeat: no lease '", ShortNodeId(request.node_id()),
                                            "...' (lapsed or unknown): register"));
  }
  it->second.last_heartbeat = now;
  ApplyState(request, &it->second);
  return absl::OkStatus();
}

absl::Status NodeRegistry::Upsert(const std::string& node_id, const v1::RegisterRequest& request,
                                  const v1::HeartbeatRequest& state) {
  if (node_id.empty()) return absl::InvalidArgumentError("register: empty node id");
  if (absl::Status valid = ValidateRegistration(request, options_.tokenizer_fingerprint);
      !valid.ok()) {
    return valid;
  }
  absl::MutexLock lock(&mu_);
  Node& node = nodes_[node_id];
  // Replaced as registered, keeping what routing added since (load, blocks routed there).
  Node registered = NodeOf(node_id, request, clock_->Now());
  node.id = std::move(registered.id);
  node.info = std::move(registered.info);
  node.frontiers = std::move(registered.frontiers);
  node.last_heartbeat = registered.last_heartbeat;
  node.external = true;
  if (request.role() == v1::NODE_ROLE_CONSUMER) {
    for (const v1::ModelEntry& model : request.models()) known_targets_.insert(model.name());
  }
  ApplyState(state, &node);
  NoteChange();
  return absl::OkStatus();
}

std::vector<std::string> NodeRegistry::ExternalNodeIds() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> ids;
  for (const auto& [id, node] : nodes_) {
    if (node.external) ids.push_back(id);
  }
  return ids;
}

void NodeRegistry::NoteRouted(const Route& route, const PrefixHint* hint) {
  absl::MutexLock lock(&mu_);
  // `target`: the route's target index when it prefills locally on node `id` (-1: none).
  auto note = [&](const std::string& id, int64_t kv_bytes, int64_t target) {
    auto it = nodes_.find(id);
    if (it == nodes_.end()) return;
    Node& node = it->second;
    ++node.routed;
    ++node.routed_since_beat;
    node.routed_bytes += kv_bytes;
    if (target >= 0) node.prefilling.insert({route.id, static_cast<size_t>(target)});
    if (hint != nullptr && node.has_prefix_cache &&
        node.prefix_blocks.size() + hint->blocks.size() <= kReportedPrefixBlocks) {
      node.prefix_blocks.insert(hint->blocks.begin(), hint->blocks.end());
    }
  };
  // The producer's prefill runs until the route's first token (its key: the target count).
  if (!route.producer_node.empty()) {
    note(route.producer_node, 0, static_cast<int64_t>(route.targets.size()));
  }
  for (size_t i = 0; i < route.targets.size(); ++i) {
    const RouteTarget& target = route.targets[i];
    note(target.consumer_node, target.kv_bytes,
         target.mode == TransferMode::kLocal ? static_cast<int64_t>(i) : -1);
  }
}

void NodeRegistry::NoteFirstToken(const Route& route, size_t target) {
  if (target >= route.targets.size()) return;
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(route.targets[target].consumer_node);
  if (it != nodes_.end()) it->second.prefilling.erase({route.id, target});
  // A first token from codes: the producer's prefill for the route is over.
  if (!route.producer_node.empty() && route.targets[target].mode != TransferMode::kLocal) {
    it = nodes_.find(route.producer_node);
    if (it != nodes_.end()) it->second.prefilling.erase({route.id, route.targets.size()});
  }
}

void NodeRegistry::RoutedDone(const Route& route) {
  absl::MutexLock lock(&mu_);
  auto done = [&](const std::string& id, int64_t kv_bytes, size_t target) {
    auto it = nodes_.find(id);
    if (it == nodes_.end()) return;
    it->second.prefilling.erase({route.id, target});  // ended before its first token
    if (it->second.routed == 0) return;
    --it->second.routed;
    it->second.routed_bytes = std::max<int64_t>(0, it->second.routed_bytes - kv_bytes);
  };
  if (!route.producer_node.empty()) done(route.producer_node, 0, route.targets.size());
  for (size_t i = 0; i < route.targets.size(); ++i) {
    done(route.targets[i].consumer_node, route.targets[i].kv_bytes, i);
  }
}

absl::Status NodeRegistry::Deregister(const std::string& node_id) {
  absl::MutexLock lock(&mu_);
  if (nodes_.erase(node_id) == 0) {
    return absl::NotFoundError(absl::StrCat("deregister: no node '", ShortNodeId(node_id), "...'"));
  }
  links_.Forget(node_id);
  NoteChange();
  return absl::OkStatus();
}

std::vector<std::string> NodeRegistry::ExpireLapsed() {
  std::vector<std::string> dropped;
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  for (auto it = nodes_.begin(); it != nodes_.end();) {
    if (Live(it->second, now, options_.lease)) {
      ++it;
      continue;
    }
    dropped.push_back(absl::StrCat(ShortNodeId(it->first), " (", RoleName(it->second.info.role()),
                                   " ", ForLog(it->second.info.address()), ")"));
    const std::string id = it->first;
    it = nodes_.erase(it);
    links_.Forget(id);
  }
  if (!dropped.empty()) NoteChange();
  return dropped;
}

absl::StatusOr<Route> NodeRegistry::Resolve(const std::vector<std::string>& targets,
                                            RequestedMode mode, const PrefixHint* hint,
                                            double max_kl, double ttft_slo_ms,
                                            bool local_fallback) const {
  if (targets.empty()) return absl::InvalidArgumentError("no target named");
  if (std::set<std::string>(targets.begin(), targets.end()).size() != targets.size()) {
    return absl::InvalidArgumentError("a target is named twice");
  }
  absl::MutexLock lock(&mu_);
  const RoutingView view{nodes_, known_targets_, links_, options_, clock_->Now()};
  RouteAsk ask{targets, mode, hint, max_kl, ttft_slo_ms};
  ask.local_fallback = local_fallback;
  return ChooseRoute(view, ask, &routes_);
}

void NodeRegistry::NoteUnreachable(const std::string& node_id, const std::string& why) {
  EjectionListener tell;
  {
    absl::MutexLock lock(&mu_);
    auto it = nodes_.find(node_id);
    if (it == nodes_.end()) return;
    const bool was_out = it->second.ejection.out;
    Eject(&it->second.ejection, clock_->Now(), why);
    if (was_out) return;
    ++ejection_counts_.ejected;
    spdlog::warn("{} ({} {}) out of routing: {}", node_id, RoleName(it->second.info.role()),
                 it->second.info.address(), ForLog(why, 300));
    tell = ejection_listener_;
  }
  NoteChange();
  if (tell) tell(node_id, why);
}

void NodeRegistry::NoteAdvice(const std::string& node_id, const std::string& from,
                              const std::string& why) {
  {
    absl::MutexLock lock(&mu_);
    auto it = nodes_.find(node_id);
    if (it == nodes_.end() || !Advise(&it->second.ejection, clock_->Now())) return;
    ++ejection_counts_.advice_heard;
    spdlog::info("{} ({} {}) suspect: coordinator {} took it out ({}); probing it", node_id,
                 RoleName(it->second.info.role()), it->second.info.address(), ForLog(from, 40),
                 ForLog(why, 200));
  }
  NoteChange();
}

void NodeRegistry::SetEjectionListener(EjectionListener listener) {
  absl::MutexLock lock(&mu_);
  ejection_listener_ = std::move(listener);
}

NodeRegistry::EjectionCounts NodeRegistry::ejection_counts() const {
  absl::MutexLock lock(&mu_);
  return ejection_counts_;
}

std::vector<NodeRegistry::DueProbe> NodeRegistry::TakeDueProbes() {
  std::vector<DueProbe> due;
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  for (auto& [id, node] : nodes_) {
    if (TakeProbe(&node.ejection, now)) due.push_back({id, node.info.address(), node.info.role()});
  }
  return due;
}

void NodeRegistry::NoteProbe(const std::string& node_id, bool ok) {
  EjectionListener tell;
  std::string why;
  {
    absl::MutexLock lock(&mu_);
    auto it = nodes_.find(node_id);
    if (it == nodes_.end()) return;
    const Node& node = it->second;
    switch (ProbeAnswered(&it->second.ejection, ok, clock_->Now(),
                          "another coordinator took it out and its probe here failed too")) {
      case ProbeOutcome::kNone:
        return;
      case ProbeOutcome::kCleared:
        ++ejection_counts_.advice_cleared;
        spdlog::info("{} ({} {}) no longer suspect: its probe passed", node_id,
                     RoleName(node.info.role()), node.info.address());
        break;  // it never left routing
      case ProbeOutcome::kBack:
        ++ejection_counts_.returned;
        spdlog::info("{} ({} {}) back in routing: its probe passed {} times", node_id,
                     RoleName(node.info.role()), node.info.address(), kProbesToReturn);
        break;
      case ProbeOutcome::kEjected:
        ++ejection_counts_.advice_confirmed;
        ++ejection_counts_.ejected;
        why = node.ejection.why;
        spdlog::warn("{} ({} {}) out of routing: {}", node_id, RoleName(node.info.role()),
                     node.info.address(), why);
        tell = ejection_listener_;
        break;
    }
  }
  NoteChange();
  if (tell) tell(node_id, why);
}

bool NodeRegistry::Ejected(const std::string& node_id) const {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node_id);
  return it != nodes_.end() && it->second.ejection.out;
}

uint32_t NodeRegistry::NodesOut() const {
  absl::MutexLock lock(&mu_);
  uint32_t out = 0;
  for (const auto& [id, node] : nodes_) out += node.ejection.out ? 1 : 0;
  return out;
}

absl::StatusOr<Route> NodeRegistry::ResolveMove(const std::string& target,
                                                const MoveConstraint& move,
                                                TransferMode mode) const {
  const std::vector<std::string> targets{target};
  absl::MutexLock lock(&mu_);
  const RoutingView view{nodes_, known_targets_, links_, options_, clock_->Now()};
  RouteAsk ask{targets, RequestedMode(mode)};
  ask.move = &move;
  return ChooseRoute(view, ask, &routes_);
}

absl::StatusOr<TakeoverCandidate> NodeRegistry::ResolveTakeover(
    const std::string& consumer_node, const std::string& fingerprint,
    const std::set<std::string>& exclude) const {
  absl::MutexLock lock(&mu_);
  const RoutingView view{nodes_, known_targets_, links_, options_, clock_->Now()};
  return ChooseTakeoverProducer(view, consumer_node, fingerprint, exclude);
}

void NodeRegistry::NoteLinkShape(const std::string& producer_node, const v1::LinkShape& shape) {
  absl::MutexLock lock(&mu_);
  if (nodes_.count(producer_node) == 0) return;
  links_.NoteShape(producer_node, shape, clock_->Now());
}

void NodeRegistry::ObserveFinished(const Route& route, const RouteTarget& target,
                                   const v1::Finished& finished) {
  if (route.producer_node.empty() || RanMode(finished) == TransferMode::kLocal) return;
  absl::MutexLock lock(&mu_);
  if (nodes_.count(route.producer_node) == 0) return;  // gone: nothing to learn for
  links_.Observe(route.producer_node, target.consumer_node, route.routed_at, finished,
                 clock_->Now());
}

std::vector<v1::ModelInfo> NodeRegistry::Models() const {
  std::vector<v1::ModelInfo> models;
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  for (const auto& [id, node] : nodes_) {
    if (!Routable(node, now, options_.lease)) continue;
    for (const v1::ModelEntry& entry : node.info.models()) {
      v1::ModelInfo& info = models.emplace_back();
      info.set_name(entry.name());
      info.set_role(RoleName(node.info.role()));
      info.set_fingerprint(entry.fingerprint());
      // The public API where the node has one (consumers); never the control address.
      info.set_address(node.info.public_address());
      for (const std::string& transport : node.info.transports()) info.add_transports(transport);
      for (const v1::ArtifactEntry& artifact : node.info.artifacts()) {
        if (artifact.consumer_fingerprint() == entry.fingerprint()) {
          info.add_producers(artifact.producer_fingerprint());
        }
      }
    }
  }
  return models;
}

std::vector<NodeRegistry::ProducerNode> NodeRegistry::Producers(const std::string& match) const {
  std::vector<ProducerNode> producers;
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  for (const auto& [id, node] : nodes_) {
    if (node.info.role() != v1::NODE_ROLE_PRODUCER || !Live(node, now, options_.lease)) continue;
    const std::string name = node.info.models_size() > 0 ? node.info.models(0).name() : "";
    bool matched = match.empty() || match == id;
    for (const v1::ModelEntry& entry : node.info.models()) matched |= entry.name() == match;
    if (matched) producers.push_back({id, name, node.info.address()});
  }
  return producers;
}

size_t NodeRegistry::size() const {
  absl::MutexLock lock(&mu_);
  return nodes_.size();
}

bool NodeRegistry::AwaitSize(size_t nodes, absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  auto enough = [this, nodes]()
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return nodes_.size() >= nodes; };
  return clock_->AwaitWithDeadline(&mu_, absl::Condition(&enough), deadline);
}

}  // namespace scd::coordinator
