#include "coordinator/registered_node.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "proto/frontier_proto.h"
#include "proto/node_speeds.h"
#include "proto/registry_client.h"

namespace scd::coordinator {

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

absl::Status ValidateRegistration(const v1::RegisterRequest& request,
                                  const std::string& tokenizer_fingerprint) {
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
  if (!tokenizer_fingerprint.empty() && !request.tokenizer_fingerprint().empty() &&
      request.tokenizer_fingerprint() != tokenizer_fingerprint) {
    return absl::FailedPreconditionError(absl::StrCat(
        "register: the node's tokenizer (", ShortFingerprint(request.tokenizer_fingerprint()),
        ") is not the coordinator's (", ShortFingerprint(tokenizer_fingerprint),
        "): the prompt ids it tokenizes would mean other tokens there"));
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

RegisteredNode NodeOf(std::string id, const v1::RegisterRequest& request, absl::Time now) {
  RegisteredNode node;
  node.id = std::move(id);
  node.info = request;
  for (const v1::ArtifactEntry& artifact : request.artifacts()) {
    absl::StatusOr<Frontier> f = FrontierFromEntry(artifact);
    if (f.ok() && !f->empty()) node.frontiers[artifact.id()] = *std::move(f);
  }
  node.last_heartbeat = now;
  return node;
}

void ApplyState(const v1::HeartbeatRequest& state, RegisteredNode* node) {
  node->active_requests = state.active_requests();
  node->routed_since_beat = 0;
  node->kv_reserved = static_cast<int64_t>(state.kv_reserved_bytes());
  node->kv_queued = static_cast<int64_t>(state.kv_queued_bytes());
  node->queued_requests = state.queued_requests();
  node->decoding = state.decoding_sequences();
  node->speeds = CheckedSpeeds(state.speeds());
  if (state.has_prefix_blocks()) {
    // At most what registry.proto allows a report (the most recently used come first).
    const auto& blocks = state.prefix_blocks().blocks();
    const int kept = std::min<int>(blocks.size(), static_cast<int>(kReportedPrefixBlocks));
    node->prefix_blocks = absl::flat_hash_set<uint64_t>(blocks.begin(), blocks.begin() + kept);
    node->has_prefix_cache = state.prefix_blocks().block_tokens() > 0;
  }
}

bool Live(const RegisteredNode& node, absl::Time now, absl::Duration lease) {
  return node.external || now - node.last_heartbeat <= lease;
}

bool Routable(const RegisteredNode& node, absl::Time now, absl::Duration lease) {
  return !node.ejection.out && Live(node, now, lease);
}

int64_t FreeBytes(const RegisteredNode& node) {
  const int64_t budget = static_cast<int64_t>(node.info.kv_budget_bytes());
  if (budget <= 0) return std::numeric_limits<int64_t>::max();
  return budget - std::max(node.kv_reserved + node.kv_queued, node.routed_bytes);
}

double Load(const RegisteredNode& node) {
  const int64_t budget = static_cast<int64_t>(node.info.kv_budget_bytes());
  if (node.info.role() == v1::NODE_ROLE_CONSUMER && budget > 0) {
    const double used = static_cast<double>(budget - FreeBytes(node)) / static_cast<double>(budget);
    return used * std::max<uint32_t>(1, node.info.capacity());
  }
  return std::max(node.active_requests, node.routed);
}

bool AtCapacity(const RegisteredNode& node, int64_t need) {
  if (node.info.role() == v1::NODE_ROLE_CONSUMER && node.info.kv_budget_bytes() > 0) {
    return FreeBytes(node) < std::max<int64_t>(need, 1);
  }
  return node.info.capacity() > 0 &&
         std::max(node.active_requests, node.routed) >= node.info.capacity();
}

size_t Matched(const RegisteredNode& node, const PrefixHint* hint) {
  if (hint == nullptr) return 0;
  size_t matched = 0;
  while (matched < hint->blocks.size() && node.prefix_blocks.count(hint->blocks[matched]) > 0) {
    ++matched;
  }
  return matched;
}

double RoutingCost(const RegisteredNode& node, const PrefixHint* hint, double load_weight) {
  const double blocks = hint != nullptr ? static_cast<double>(hint->blocks.size()) : 0.0;
  const double to_compute = blocks - static_cast<double>(Matched(node, hint));
  const int64_t need =
      hint != nullptr ? hint->kv_positions * static_cast<int64_t>(node.info.kv_bytes_per_token())
                      : 0;
  return to_compute + load_weight * Load(node) * std::max(blocks, 1.0) +
         (AtCapacity(node, need) ? 1e18 : 0.0);
}

}  // namespace scd::coordinator
