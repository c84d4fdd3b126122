// Route choice: how the coordinator turns a request's targets and mode into a Route -- one
// producer for every target that needs codes (a fan-out runs one prefill), and per target a
// consumer node and the mode actually used, chosen only where the pair can serve it: modes that
// need a translator artifact (reuse, scd) only where the consumer registered an artifact for that
// producer's fingerprint; `auto` picks scd with an artifact, else raw between identical weights,
// else local, and says why. With the artifact's frontier (registered with it, codec/frontier.h)
// scd sends a chosen point: auto the cheapest within the request's max_kl, else the recommended
// one, and local prefill when no point is within max_kl; explicit scd the fitted configuration,
// or with max_kl the cheapest within it. Once the nodes report their speeds (heartbeats'
// NodeSpeeds), auto instead weighs local prefill against every point within the budget (max_kl,
// else the recommended point's KL), or the raw cache between identical weights, by predicted time
// to first token (coordinator/auto_choice.h), or with ttft_slo_ms picks the best quality
// predicted to meet it; the link as LinkBook knows it.
//
// Cache-aware: consumers and producers are preferred by RoutingCost (registered_node.h), the
// longest run of the prompt's cached prefix blocks against load; a node at capacity only when
// every candidate is (the consumer then queues the request).
//
// Thread-safety: pure functions of the view given (the registry calls them under its lock).
#ifndef SCD_COORDINATOR_ROUTE_CHOICE_H_
#define SCD_COORDINATOR_ROUTE_CHOICE_H_

#include <atomic>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "codec/frontier.h"
#include "codec/transfer_mode.h"
#include "coordinator/auto_choice.h"
#include "coordinator/link_book.h"
#include "coordinator/registered_node.h"

namespace scd::coordinator {

// One target of a routed request.
struct RouteTarget {
  std::string target;            // consumer model name
  std::string consumer_node;     // node id
  std::string consumer_address;  // its gRPC services
  std::string transfer_address;  // its transport listener
  std::string consumer_fingerprint;
  TransferMode mode = TransferMode::kLocal;  // the mode this target will use
  std::string mode_reason;                   // why (always set)
  std::string artifact_id;                   // the artifact the mode uses ("" when none)
  int64_t kv_bytes = 0;  // the KV memory the request will reserve on the consumer (0: unknown)
  // Prompt positions the consumer's prefix cache held, as its last report said (0: none, or
  // unknown without a prefix hint); Started says how many it really loaded.
  uint32_t consumer_cached_tokens = 0;
  // scd from an artifact with a frontier: the point chosen (ranks and precision; the measured
  // fields as the frontier has them). Unset: the fitted configuration at the nodes' precision.
  std::optional<FrontierPoint> point;
  // Auto's predicted time to first token for the choice (Finished.predicted_ttft_us; 0: none).
  double predicted_ttft_us = 0;
  // Auto's frontier point, adapted in flight (PrefillTarget.adapt_within_us): the codes should
  // have arrived this long after the request's start (the ttft_slo_ms less what follows the
  // last byte, else the prediction's delivery with 25 % slack); 0: no adaptation. And the
  // goodput the prediction assumed (bytes/s, 0: unlimited or unknown).
  double deliver_by_us = 0;
  double planned_goodput_bytes_per_s = 0;
};

struct Route {
  // The producer every code-receiving target shares; empty when every target runs local.
  std::string producer_node, producer_address, producer_name, producer_fingerprint;
  // Prompt positions the producer's cache held, as its last report (and the requests routed to
  // it since) said: Started.producer_cached_tokens.
  uint32_t producer_cached_tokens = 0;
  std::vector<RouteTarget> targets;  // in the request's order
  absl::Time routed_at;              // the registry's clock when Resolve made it
  uint64_t id = 0;                   // Resolve's, unique in this registry
};

// What a route is chosen from.
struct RoutingView {
  const NodeMap& nodes;
  // Target names consumers have registered, live or not (UNAVAILABLE rather than NOT_FOUND).
  const std::set<std::string>& known_targets;
  const LinkBook& links;
  const RegistryOptions& options;
  absl::Time now;
};

// A moved stream's new replica (NodeRegistry::ResolveMove): none of these nodes, and a model of
// the target's name with these weights (its fingerprint).
struct MoveConstraint {
  std::set<std::string> exclude_nodes;
  std::string consumer_fingerprint;
};

// What a request asks of routing (NodeRegistry::Resolve says what each means).
struct RouteAsk {
  const std::vector<std::string>& targets;  // distinct, at least one
  RequestedMode mode;
  const PrefixHint* hint = nullptr;  // may be null
  double max_kl = 0;
  double ttft_slo_ms = 0;
  const MoveConstraint* move = nullptr;  // a moved stream's (null: none)
  // No live producer for an explicit transfer mode: local prefill, saying why (the request
  // allows its fallback), instead of UNAVAILABLE.
  bool local_fallback = false;
};

// The route, or why none (NodeRegistry::Resolve's errors). `route_ids` numbers the routes made.
absl::StatusOr<Route> ChooseRoute(const RoutingView& view, const RouteAsk& ask,
                                  std::atomic<uint64_t>* route_ids);

// A takeover's producer (coordinator/producer_takeover.h): a routable producer whose model has
// `fingerprint` (the same weights as the one lost), none of `exclude`, least loaded; with what
// auto knows of it and of `consumer_node` (AutoInputs without the prompt). UNAVAILABLE when none.
struct TakeoverCandidate {
  std::string node_id, address, name;
  AutoInputs inputs;
};
absl::StatusOr<TakeoverCandidate> ChooseTakeoverProducer(const RoutingView& view,
                                                         const std::string& consumer_node,
                                                         const std::string& fingerprint,
                                                         const std::set<std::string>& exclude);

}  // namespace scd::coordinator

#endif  // SCD_COORDINATOR_ROUTE_CHOICE_H_
