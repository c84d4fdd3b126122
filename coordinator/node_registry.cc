#include "coordinator/node_registry.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/log_text.h"
#include "base/random_id.h"
#include "base/status_macros.h"
#include "codec/transfer_mode.h"
#include "proto/frontier_proto.h"
#include "proto/node_speeds.h"
#include "proto/wire_mode.h"

namespace scd::coordinator {
namespace {

const char* RoleName(v1::NodeRole role) {
  switch (role) {
    case v1::NODE_ROLE_PRODUCER:
      return "producer";
    case v1::NODE_ROLE_CONSUMER:
      return "consumer";
    default:
      return "unspecified";
  }
}

std::string ShortFingerprint(const std::string& fingerprint) { return fingerprint.substr(0, 12); }

}  // namespace

NodeRegistry::NodeRegistry(RegistryOptions options, Clock* clock)
    : options_(options), clock_(clock) {}

namespace {

absl::Status ValidateRegistration(const v1::RegisterRequest& request) {
  if (request.role() != v1::NODE_ROLE_PRODUCER && request.role() != v1::NODE_ROLE_CONSUMER) {
    return absl::InvalidArgumentError("register: role must be producer or consumer");
  }
  if (request.address().empty()) return absl::InvalidArgumentError("register: no address");
  if (request.models().empty()) return absl::InvalidArgumentError("register: no models");
  std::set<std::string> fingerprints;
  for (const v1::ModelEntry& model : request.models()) {
    if (model.name().empty() || model.fingerprint().empty()) {
      return absl::InvalidArgumentError("register: every model needs a name and a fingerprint");
    }
    fingerprints.insert(model.fingerprint());
  }
  if (request.role() == v1::NODE_ROLE_CONSUMER && request.transfer_address().empty()) {
    return absl::InvalidArgumentError("register: a consumer needs a transfer address");
  }
  for (const v1::ArtifactEntry& artifact : request.artifacts()) {
    if (fingerprints.count(artifact.consumer_fingerprint()) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "register: artifact ", artifact.id(), " is for consumer model ",
          ShortFingerprint(artifact.consumer_fingerprint()), ", which this node does not serve"));
    }
    if (absl::StatusOr<Frontier> f = FrontierFromEntry(artifact); !f.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("register: ", f.status().message()));
    }
  }
  return absl::OkStatus();
}

// The frontiers of a validated registration, by artifact id.
std::map<std::string, Frontier> Frontiers(const v1::RegisterRequest& request) {
  std::map<std::string, Frontier> out;
  for (const v1::ArtifactEntry& artifact : request.artifacts()) {
    absl::StatusOr<Frontier> f = FrontierFromEntry(artifact);
    if (f.ok() && !f->empty()) out[artifact.id()] = *std::move(f);
  }
  return out;
}

}  // namespace

absl::StatusOr<Lease> NodeRegistry::Register(const v1::RegisterRequest& request) {
  if (absl::Status valid = ValidateRegistration(request); !valid.ok()) return valid;
  absl::MutexLock lock(&mu_);
  Node node;
  node.id = absl::StrCat(RoleName(request.role()), "-", RandomId128());
  if (request.role() == v1::NODE_ROLE_CONSUMER) {
    for (const v1::ModelEntry& model : request.models()) known_targets_.insert(model.name());
  }
  node.info = request;
  node.frontiers = Frontiers(request);
  node.last_heartbeat = clock_->Now();
  const std::string id = node.id;
  nodes_.emplace(id, std::move(node));
  return Lease{id, options_.lease, options_.heartbeat_interval};
}

absl::Status NodeRegistry::Heartbeat(const v1::HeartbeatRequest& request) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(request.node_id());
  const absl::Time now = clock_->Now();
  if (it == nodes_.end() || !Live(it->second, now)) {
    return absl::NotFoundError(absl::StrCat("heartbeat: no lease '", ShortNodeId(request.node_id()),
                                            "...' (lapsed or unknown): register"));
  }
  it->second.last_heartbeat = now;
  ApplyState(it->second, request);
  return absl::OkStatus();
}

void NodeRegistry::ApplyState(Node& node, const v1::HeartbeatRequest& state) {
  node.active_requests = state.active_requests();
  node.routed_since_beat = 0;
  node.kv_reserved = static_cast<int64_t>(state.kv_reserved_bytes());
  node.kv_queued = static_cast<int64_t>(state.kv_queued_bytes());
  node.queued_requests = state.queued_requests();
  node.decoding = state.decoding_sequences();
  node.speeds = CheckedSpeeds(state.speeds());
  if (state.has_prefix_blocks()) {
    // At most what registry.proto allows a report (the most recently used come first).
    const auto& blocks = state.prefix_blocks().blocks();
    const int kept = std::min<int>(blocks.size(), static_cast<int>(kReportedPrefixBlocks));
    node.prefix_blocks = std::set<uint64_t>(blocks.begin(), blocks.begin() + kept);
    node.has_prefix_cache = state.prefix_blocks().block_tokens() > 0;
  }
}

absl::Status NodeRegistry::Upsert(const std::string& node_id, const v1::RegisterRequest& request,
                                  const v1::HeartbeatRequest& state) {
  if (node_id.empty()) return absl::InvalidArgumentError("register: empty node id");
  if (absl::Status valid = ValidateRegistration(request); !valid.ok()) return valid;
  absl::MutexLock lock(&mu_);
  Node& node = nodes_[node_id];
  node.id = node_id;
  node.info = request;
  node.frontiers = Frontiers(request);
  node.external = true;
  node.last_heartbeat = clock_->Now();
  if (request.role() == v1::NODE_ROLE_CONSUMER) {
    for (const v1::ModelEntry& model : request.models()) known_targets_.insert(model.name());
  }
  ApplyState(node, state);
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

int64_t NodeRegistry::FreeBytes(const Node& node) {
  const int64_t budget = static_cast<int64_t>(node.info.kv_budget_bytes());
  if (budget <= 0) return std::numeric_limits<int64_t>::max();
  return budget - std::max(node.kv_reserved + node.kv_queued, node.routed_bytes);
}

double NodeRegistry::Load(const Node& node) const {
  const int64_t budget = static_cast<int64_t>(node.info.kv_budget_bytes());
  if (node.info.role() == v1::NODE_ROLE_CONSUMER && budget > 0) {
    const double used = static_cast<double>(budget - FreeBytes(node)) / static_cast<double>(budget);
    return used * std::max<uint32_t>(1, node.info.capacity());
  }
  return std::max(node.active_requests, node.routed);
}

bool NodeRegistry::AtCapacity(const Node& node, int64_t need) const {
  if (node.info.role() == v1::NODE_ROLE_CONSUMER && node.info.kv_budget_bytes() > 0) {
    return FreeBytes(node) < std::max<int64_t>(need, 1);
  }
  return node.info.capacity() > 0 &&
         std::max(node.active_requests, node.routed) >= node.info.capacity();
}

size_t NodeRegistry::Matched(const Node& node, const PrefixHint* hint) {
  if (hint == nullptr) return 0;
  size_t matched = 0;
  while (matched < hint->blocks.size() && node.prefix_blocks.count(hint->blocks[matched]) > 0) {
    ++matched;
  }
  return matched;
}

double NodeRegistry::Cost(const Node& node, const PrefixHint* hint) const {
  const double blocks = hint != nullptr ? static_cast<double>(hint->blocks.size()) : 0.0;
  const double to_compute = blocks - static_cast<double>(Matched(node, hint));
  const int64_t need =
      hint != nullptr ? hint->kv_positions * static_cast<int64_t>(node.info.kv_bytes_per_token())
                      : 0;
  return to_compute + options_.prefix_load_weight * Load(node) * std::max(blocks, 1.0) +
         (AtCapacity(node, need) ? 1e18 : 0.0);
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
  ForgetLinks(node_id);
  return absl::OkStatus();
}

std::vector<std::string> NodeRegistry::ExpireLapsed() {
  std::vector<std::string> dropped;
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  for (auto it = nodes_.begin(); it != nodes_.end();) {
    if (Live(it->second, now)) {
      ++it;
      continue;
    }
    dropped.push_back(absl::StrCat(ShortNodeId(it->first), " (", RoleName(it->second.info.role()),
                                   " ", ForLog(it->second.info.address()), ")"));
    const std::string id = it->first;
    it = nodes_.erase(it);
    ForgetLinks(id);
  }
  return dropped;
}

void NodeRegistry::ForgetLinks(const std::string& node_id) {
  for (auto it = links_.begin(); it != links_.end();) {
    const bool either = it->first.first == node_id || it->first.second == node_id;
    it = either ? links_.erase(it) : std::next(it);
  }
}

bool NodeRegistry::Live(const Node& node, absl::Time now) const {
  return node.external || now - node.last_heartbeat <= options_.lease;
}

const NodeRegistry::Node* NodeRegistry::PickConsumer(const std::string& name, absl::Time now,
                                                     const PrefixHint* hint) const {
  const Node* best = nullptr;
  double best_cost = 0;
  for (const auto& [id, node] : nodes_) {
    if (node.info.role() != v1::NODE_ROLE_CONSUMER || !Live(node, now)) continue;
    const bool serves = std::any_of(node.info.models().begin(), node.info.models().end(),
                                    [&](const v1::ModelEntry& m) { return m.name() == name; });
    if (!serves) continue;
    const double cost = Cost(node, hint);
    if (best == nullptr || cost < best_cost || (cost == best_cost && Load(node) < Load(*best))) {
      best = &node;
      best_cost = cost;
    }
  }
  return best;
}

// What one target's resolution knows of its producer -> consumer pair.
struct NodeRegistry::TargetPair {
  const v1::ModelEntry* source = nullptr;       // the producer's model
  const v1::ArtifactEntry* artifact = nullptr;  // the consumer's artifact for the pair, if any
  const Frontier* frontier = nullptr;           // the artifact's frontier, if any
  const FrontierPoint* within = nullptr;        // its cheapest point within max_kl, if any
  bool identical = false;                       // the same weights on both sides
  std::string text;                             // "producer -> target", for reasons
  double max_kl = 0;
  // Auto has choices to weigh: a frontier's points, or the raw cache between identical weights.
  bool choosable() const { return frontier != nullptr || (identical && artifact == nullptr); }
  std::string budget() const { return absl::StrFormat("max_kl %g", max_kl); }  // reasons only
};

absl::StatusOr<RouteTarget> NodeRegistry::ResolveTarget(
    const Node& consumer, const std::string& name, const Node* producer, RequestedMode mode,
    double max_kl, double ttft_slo_ms, const PrefixHint* hint, absl::Time now) const {
  RouteTarget target;
  target.target = name;
  target.consumer_node = consumer.id;
  target.consumer_address = consumer.info.address();
  target.transfer_address = consumer.info.transfer_address();
  for (const v1::ModelEntry& model : consumer.info.models()) {
    if (model.name() == name) target.consumer_fingerprint = model.fingerprint();
  }
  if (mode.Is(TransferMode::kLocal)) {
    target.mode = TransferMode::kLocal;
    target.mode_reason = "requested";
    return target;
  }
  if (producer == nullptr) {
    if (!mode.is_auto()) {
      return absl::UnavailableError(absl::StrCat("mode ", RequestedModeName(mode),
                                                 " needs a producer and none is registered"));
    }
    target.mode = TransferMode::kLocal;
    target.mode_reason = "no producer registered: local prefill";
    return target;
  }
  TargetPair pair;
  pair.source = &producer->info.models(0);
  for (const v1::ArtifactEntry& held : consumer.info.artifacts()) {
    if (held.producer_fingerprint() == pair.source->fingerprint() &&
        held.consumer_fingerprint() == target.consumer_fingerprint) {
      pair.artifact = &held;
    }
  }
  pair.identical = pair.source->fingerprint() == target.consumer_fingerprint;
  pair.text = absl::StrCat(pair.source->name(), " -> ", name);
  if (pair.artifact != nullptr) {
    auto it = consumer.frontiers.find(pair.artifact->id());
    if (it != consumer.frontiers.end()) pair.frontier = &it->second;
  }
  pair.max_kl = max_kl;
  pair.within =
      pair.frontier != nullptr && max_kl > 0 ? pair.frontier->CheapestWithin(max_kl) : nullptr;
  if (!mode.is_auto()) {
    SCD_RETURN_IF_ERROR(ResolveExplicit(consumer, pair, mode.mode(), &target));
    return target;
  }
  if (!pair.choosable() ||
      !ResolveAutoPredicted(consumer, *producer, pair, ttft_slo_ms, hint, now, &target)) {
    ResolveAutoUnpredicted(pair, ttft_slo_ms, &target);
  }
  return target;
}

bool NodeRegistry::ResolveAutoPredicted(const Node& consumer, const Node& producer,
                                        const TargetPair& pair, double ttft_slo_ms,
                                        const PrefixHint* hint, absl::Time now,
                                        RouteTarget* target) const {
  // With the nodes' speeds measured: the choice predicted to reach the first token soonest.
  const AutoInputs inputs = hint != nullptr && hint->prompt_tokens > 0
                                ? InputsFor(consumer, producer, hint, now)
                                : AutoInputs();
  if (!CanPredict(inputs)) return false;
  const Frontier* frontier = pair.frontier;
  const std::vector<AutoCandidate> candidates =
      AutoCandidates(inputs, frontier, static_cast<double>(consumer.info.kv_bytes_per_token()));
  const double budget_kl = pair.max_kl > 0       ? pair.max_kl
                           : frontier != nullptr ? frontier->points[frontier->recommended].kl
                                                 : 0;
  const std::string budget = pair.max_kl > 0 ? pair.budget()
                             : frontier != nullptr
                                 ? absl::StrFormat("the recommended point's KL %.4g", budget_kl)
                                 : std::string("exact caches (identical weights)");
  // What auto chose before it had a cost model: the cheapest point within max_kl, else the
  // recommended one (local when no point is within max_kl), or the raw cache.
  size_t incumbent = 1;
  if (frontier != nullptr) {
    incumbent = pair.max_kl > 0
                    ? (pair.within != nullptr ? 1 + (pair.within - frontier->points.data()) : 0)
                    : 1 + static_cast<size_t>(frontier->recommended);
  }
  const AutoChoice choice = ChooseAuto(candidates, budget_kl, budget, ttft_slo_ms * 1e3, incumbent);
  const AutoCandidate& chosen = candidates[choice.chosen];
  target->mode = chosen.mode;
  target->point = chosen.point;
  target->predicted_ttft_us = chosen.predicted.total_us;
  if (chosen.mode == TransferMode::kScd) {
    target->artifact_id = pair.artifact->id();
    // Adapt only over a link known to be limited (shaped or measured): with none known, a
    // transfer later than predicted is the nodes' compute, which lower ranks do not speed up.
    if (inputs.goodput_bytes_per_s > 0) {
      target->deliver_by_us = DeliverByUs(chosen.predicted, ttft_slo_ms * 1e3);
      target->planned_goodput_bytes_per_s = inputs.goodput_bytes_per_s;
    }
  }
  target->mode_reason = absl::StrCat(choice.reason, " (", pair.text, ", link ", inputs.link, ")");
  return true;
}

void NodeRegistry::ResolveAutoUnpredicted(const TargetPair& pair, double ttft_slo_ms,
                                          RouteTarget* target) {
  const Frontier* frontier = pair.frontier;
  const v1::ArtifactEntry* artifact = pair.artifact;
  if (artifact != nullptr && pair.max_kl > 0 && pair.within == nullptr) {
    target->mode = TransferMode::kLocal;
    target->mode_reason =
        frontier == nullptr
            ? absl::StrCat("artifact ", artifact->id(), " for ", pair.text,
                           " has no frontier to meet ", pair.budget(), ": local prefill")
            : absl::StrCat("no point of artifact ", artifact->id(), "'s frontier for ", pair.text,
                           " is within ", pair.budget(),
                           " (the best: ", PointText(*frontier, *frontier->BestQuality()),
                           "): local prefill");
  } else if (artifact != nullptr) {
    target->mode = TransferMode::kScd;
    target->mode_reason = absl::StrCat("artifact ", artifact->id(), " for ", pair.text);
    target->artifact_id = artifact->id();
    if (frontier != nullptr) {
      const FrontierPoint& p =
          pair.within != nullptr ? *pair.within : frontier->points[frontier->recommended];
      target->point = p;
      absl::StrAppend(&target->mode_reason, ", frontier point ", PointText(*frontier, p),
                      pair.within != nullptr ? absl::StrCat(": the cheapest within ", pair.budget())
                                             : ": the recommended one");
    }
  } else if (pair.identical) {
    target->mode = TransferMode::kRaw;
    target->mode_reason = absl::StrCat("identical weights (", pair.text, "), no artifact needed");
  } else {
    target->mode = TransferMode::kLocal;
    target->mode_reason = absl::StrCat("no artifact for ", pair.text, ": local prefill");
  }
  if (ttft_slo_ms > 0) {  // reached only without a prediction
    absl::StrAppend(&target->mode_reason, "; ttft_slo_ms ", ttft_slo_ms, " not weighed: ",
                    pair.choosable() ? "no node's prefill speed is measured yet"
                                     : "no frontier to choose from");
  }
}

absl::Status NodeRegistry::ResolveExplicit(const Node& consumer, const TargetPair& pair,
                                           TransferMode mode, RouteTarget* target) const {
  const std::string name = TransferModeName(mode);
  if (ModeServedWithArtifact(mode) && pair.artifact == nullptr) {
    std::vector<std::string> held;
    for (const v1::ArtifactEntry& a : consumer.info.artifacts()) {
      held.push_back(
          absl::StrCat(a.id(), " (producer ", ShortFingerprint(a.producer_fingerprint()), ")"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("mode ", name, " needs a translator artifact for ", pair.text,
                     " (producer fingerprint ", ShortFingerprint(pair.source->fingerprint()),
                     "); the consumer holds ", held.empty() ? "none" : absl::StrJoin(held, ", ")));
  }
  target->mode = mode;
  target->mode_reason = "requested";
  // Raw or int4 caches, and reuse's translated ones, are the producer's own keys and values: only
  // faithful between identical weights (scd's aligners and recompute are not limited so).
  const bool crosses_weights =
      !pair.identical &&
      (mode == TransferMode::kRaw || mode == TransferMode::kInt4 || mode == TransferMode::kReuse);
  if (crosses_weights) {
    if (options_.strict_modes) {
      return absl::FailedPreconditionError(absl::StrCat(
          "mode ", name, " cannot serve ", pair.text,
          " faithfully: the weights differ (this coordinator runs with --strict-modes; use scd, "
          "recompute, local or auto)"));
    }
    target->mode_reason =
        absl::StrCat("requested; the weights differ (", pair.text, "): quality degraded");
  }
  if (pair.artifact != nullptr && ModeServedWithArtifact(mode)) {
    target->artifact_id = pair.artifact->id();
  }
  if (mode != TransferMode::kScd || pair.max_kl <= 0) return absl::OkStatus();
  const Frontier* frontier = pair.frontier;
  if (pair.within == nullptr) {
    return absl::FailedPreconditionError(
        frontier == nullptr
            ? absl::StrCat("max_kl: artifact ", pair.artifact->id(), " for ", pair.text,
                           " has no frontier to choose a point within ", pair.budget())
            : absl::StrCat("max_kl: no point of artifact ", pair.artifact->id(), "'s frontier for ",
                           pair.text, " is within ", pair.budget(),
                           " (the best: ", PointText(*frontier, *frontier->BestQuality()),
                           "); raise it, or use mode auto to prefill locally"));
  }
  target->point = *pair.within;
  target->mode_reason =
      absl::StrCat("requested; frontier point ", PointText(*frontier, *pair.within),
                   ": the cheapest within ", pair.budget());
  return absl::OkStatus();
}

absl::StatusOr<std::vector<const NodeRegistry::Node*>> NodeRegistry::PickConsumers(
    const std::vector<std::string>& targets, absl::Time now, const PrefixHint* hint) const {
  std::vector<const Node*> consumers;
  for (const std::string& name : targets) {
    const Node* consumer = PickConsumer(name, now, hint);
    if (consumer != nullptr) {
      consumers.push_back(consumer);
      continue;
    }
    if (known_targets_.count(name) > 0) {
      return absl::UnavailableError(
          absl::StrCat("target '", ForLog(name),
                       "' has no live consumer right now (its nodes stopped "
                       "heartbeating or are draining); retry later"));
    }
    std::set<std::string> known;
    for (const auto& [id, node] : nodes_) {
      if (node.info.role() != v1::NODE_ROLE_CONSUMER || !Live(node, now)) continue;
      for (const v1::ModelEntry& m : node.info.models()) known.insert(m.name());
    }
    return absl::NotFoundError(absl::StrCat("unknown target '", ForLog(name), "'; known targets: ",
                                            known.empty() ? "none" : absl::StrJoin(known, ", ")));
  }
  return consumers;
}

absl::StatusOr<Route> NodeRegistry::Resolve(const std::vector<std::string>& targets,
                                            RequestedMode mode, const PrefixHint* hint,
                                            double max_kl, double ttft_slo_ms) const {
  if (targets.empty()) return absl::InvalidArgumentError("no target named");
  if (std::set<std::string>(targets.begin(), targets.end()).size() != targets.size()) {
    return absl::InvalidArgumentError("a target is named twice");
  }

  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  absl::StatusOr<std::vector<const Node*>> picked = PickConsumers(targets, now, hint);
  if (!picked.ok()) return picked.status();
  const std::vector<const Node*>& consumers = *picked;

  // Candidate producers, cheapest first (the longest cached run of the prompt's prefix against
  // load, at capacity last); nullptr (no producer) when none is live.
  std::vector<const Node*> producers;
  for (const auto& [id, node] : nodes_) {
    if (node.info.role() == v1::NODE_ROLE_PRODUCER && Live(node, now)) producers.push_back(&node);
  }
  std::stable_sort(producers.begin(), producers.end(), [&](const Node* a, const Node* b) {
    const double ca = Cost(*a, hint), cb = Cost(*b, hint);
    return ca != cb ? ca < cb : Load(*a) < Load(*b);
  });
  if (producers.empty()) producers.push_back(nullptr);

  // The first (least loaded) producer that can serve every target, preferring, for auto, the one
  // that sends codes to the most targets (fewest local prefills).
  std::optional<Route> best;
  int best_score = -1;
  absl::Status first_error;
  for (const Node* producer : producers) {
    Route route;
    route.routed_at = now;
    route.id = routes_.fetch_add(1) + 1;
    int score = 0;
    absl::Status error;
    for (size_t i = 0; i < targets.size(); ++i) {
      absl::StatusOr<RouteTarget> target =
          ResolveTarget(*consumers[i], targets[i], producer, mode, max_kl, ttft_slo_ms, hint, now);
      if (!target.ok()) {
        error = target.status();
        break;
      }
      score += target->mode != TransferMode::kLocal;
      if (hint != nullptr) {
        target->kv_bytes =
            hint->kv_positions * static_cast<int64_t>(consumers[i]->info.kv_bytes_per_token());
      }
      route.targets.push_back(*std::move(target));
    }
    if (!error.ok()) {
      if (first_error.ok()) first_error = error;
      continue;
    }
    if (score > best_score) {
      if (producer != nullptr && score > 0) {
        route.producer_node = producer->id;
        route.producer_address = producer->info.address();
        route.producer_name = producer->info.models(0).name();
        route.producer_fingerprint = producer->info.models(0).fingerprint();
        if (hint != nullptr) {
          route.producer_cached_tokens =
              static_cast<uint32_t>(Matched(*producer, hint) * hint->block_tokens);
        }
      }
      best = std::move(route);
      best_score = score;
    }
  }
  if (!best.has_value()) return first_error;
  return *std::move(best);
}

AutoInputs NodeRegistry::InputsFor(const Node& consumer, const Node& producer,
                                   const PrefixHint* hint, absl::Time now) const {
  AutoInputs in;
  if (hint != nullptr) {
    in.prompt_tokens = static_cast<double>(hint->prompt_tokens);
    in.consumer_cached_tokens = static_cast<double>(Matched(consumer, hint) * hint->block_tokens);
    in.producer_cached_tokens = static_cast<double>(Matched(producer, hint) * hint->block_tokens);
  }
  in.consumer = consumer.speeds;
  in.producer = producer.speeds;
  // Ahead of a local prefill: those waiting for admission and the local prefills routed there
  // and still running (they share the consumer's compute).
  in.consumer_queue = static_cast<double>(consumer.queued_requests + consumer.prefilling.size());
  // Ahead of the producer's prefill: the transfers routed to it whose first token has not come
  // (once decoding, the request no longer needs it), at most the prefills it said were running
  // at its last heartbeat and those routed since (a transfer past its prefill may still wait for
  // the consumer's rebuild: the producer is done with it).
  in.producer_queue = static_cast<double>(std::min<uint64_t>(
      producer.prefilling.size(), uint64_t{producer.active_requests} + producer.routed_since_beat));
  in.consumer_decoding = static_cast<double>(consumer.decoding);
  if (producer.shape.has_value() &&
      (producer.shape_announced || now - producer.shape_learnt <= options_.learnt_link_max_age)) {
    in.goodput_bytes_per_s = producer.shape->gbps() * 1e9 / 8;
    in.latency_us = producer.shape->latency_us();
    // No burst: the shaper's bucket is only full after the link idled (back-to-back transfers
    // find it empty), so the rate is taken from the first byte.
    in.link = absl::StrFormat("%g Gbit/s as shaped", producer.shape->gbps());
  } else if (auto it = links_.find({producer.id, consumer.id});
             it != links_.end() && it->second.Known(now)) {
    in.goodput_bytes_per_s = it->second.goodput_bytes_per_s();
    in.latency_us = it->second.latency_us();
    in.link = absl::StrFormat("%.3g Gbit/s as measured", in.goodput_bytes_per_s * 8 / 1e9);
  } else {
    in.link = "never seen holding a transfer back: taken as unlimited";
  }
  return in;
}

void NodeRegistry::NoteLinkShape(const std::string& producer_node, const v1::LinkShape& shape) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(producer_node);
  if (it == nodes_.end()) return;
  it->second.shape_set = clock_->Now();
  it->second.shape_announced = shape.gbps() > 0;
  if (shape.gbps() > 0) {
    it->second.shape = shape;
  } else {
    it->second.shape.reset();
  }
}

void NodeRegistry::ObserveFinished(const Route& route, const RouteTarget& target,
                                   const v1::Finished& finished) {
  if (route.producer_node.empty() || RanMode(finished) == TransferMode::kLocal) {
    return;
  }
  absl::MutexLock lock(&mu_);
  links_[{route.producer_node, target.consumer_node}].Observe(finished, clock_->Now());
  auto it = nodes_.find(route.producer_node);
  if (it == nodes_.end()) return;
  // A request routed before the shape was last set travelled under the old one: it says nothing
  // of the link now.
  if (route.routed_at < it->second.shape_set) return;
  if (finished.has_link() && finished.link().gbps() > 0) {
    it->second.shape = finished.link();
    it->second.shape_learnt = clock_->Now();
  } else {
    it->second.shape.reset();
    it->second.shape_announced = false;
  }
}

std::vector<v1::ModelInfo> NodeRegistry::Models() const {
  std::vector<v1::ModelInfo> models;
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  for (const auto& [id, node] : nodes_) {
    if (!Live(node, now)) continue;
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
    if (node.info.role() != v1::NODE_ROLE_PRODUCER || !Live(node, now)) continue;
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

}  // namespace scd::coordinator
