// NodeRegistry: the coordinator's view of the serving nodes and how it routes a request.
//
// Producers and consumers register (scd.v1.Registry) and hold a lease they renew by heartbeating;
// a node whose lease lapses leaves routing at the next ExpireLapsed (the coordinator sweeps every
// RegistryOptions::sweep_interval, so a silent node is gone within lease + sweep). Resolve turns a
// request's targets and mode into a Route: one producer for every target that needs codes (a
// fan-out runs one prefill), and per target a consumer node and the mode actually used, chosen
// only where the pair can serve it: modes that need a translator artifact (reuse, scd) only where
// the consumer registered an artifact for that producer's fingerprint; `auto` picks scd with an
// artifact, else raw between identical weights, else local, and says why. With the artifact's
// frontier (registered with it, codec/frontier.h) scd sends a chosen point: auto the cheapest
// within the request's max_kl, else the recommended one, and local prefill when no point is
// within max_kl; explicit scd the fitted configuration, or with max_kl the cheapest within it.
// Once the nodes report their speeds (heartbeats' NodeSpeeds), auto instead weighs local prefill
// against every point within the budget (max_kl, else the recommended point's KL), or the raw
// cache between identical weights, by predicted time to first token (coordinator/auto_choice.h),
// or with ttft_slo_ms picks the best quality predicted to meet it; the link as the shape the
// producer's codes travel under (SetLinkShape, Finished.link) or as measured from finished
// transfers (ObserveFinished).
//
// Cache-aware routing: nodes report the prefix blocks their caches hold with every heartbeat
// (registry.proto PrefixBlocks); Resolve, given the routing keys of a prompt's prefix blocks
// (base/prefix_hash.h), prefers the consumer and the producer holding the longest run of them,
// weighed against load the way Dynamo's KV router costs overlap against active work:
//   cost = blocks to compute + load_weight * load * prompt blocks,
// load = a producer's active requests (the larger of its heartbeat's count and the requests
// routed to it and not yet done); a consumer's KV memory in use as a share of its budget, in
// requests (used / budget x capacity), where used is the larger of the bytes its heartbeat
// reported reserved and queued and the bytes of the requests routed to it and not yet done (each
// request's prompt + max_tokens positions at the consumer's KV bytes per position). A consumer
// whose free bytes cannot hold the request (a producer at its capacity) is taken only when every
// candidate is: the consumer then queues it. NoteRouted records what a routed request will leave in
// its nodes' caches (the next heartbeat's report replaces it), so a second request right behind the
// first follows it; only for nodes that report a cache, and never past kReportedPrefixBlocks per
// node.
//
// Thread-safety: thread-safe (one mutex); the clock is called under it.
#ifndef SCD_COORDINATOR_NODE_REGISTRY_H_
#define SCD_COORDINATOR_NODE_REGISTRY_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "codec/frontier.h"
#include "codec/transfer_mode.h"
#include "coordinator/auto_choice.h"
#include "proto/registry_client.h"
#include "scd/v1/inference.pb.h"
#include "scd/v1/registry.pb.h"

namespace scd::coordinator {

struct RegistryOptions {
  absl::Duration lease = absl::Seconds(2);  // silent this long: dropped
  absl::Duration heartbeat_interval = absl::Milliseconds(500);
  absl::Duration sweep_interval = absl::Milliseconds(100);  // how often the service expires
  // Refuse raw / int4 / reuse between different weights (FAILED_PRECONDITION) instead of serving
  // them with a mode_reason that says the quality is degraded.
  bool strict_modes = false;
  // Cache-aware routing: one active request weighs this many cold prefills of the prompt's
  // blocks against a cache match (0: the longest match always wins among nodes not at capacity).
  double prefix_load_weight = 0.5;
  // A link shape learnt from a Finished (the codes travelled under it), where the coordinator
  // announced none, is forgotten this long after: the requests auto then prefills locally carry
  // no word of the link, which may have recovered, so auto weighs sending again (and adaptation
  // bounds what a transfer over a link still slow costs).
  absl::Duration learnt_link_max_age = absl::Seconds(10);
};

// What routing knows of a request's prompt: the routing keys of its prefix's full blocks, and
// the positions its KV cache will hold (prompt + max_tokens; 0: unknown).
struct PrefixHint {
  std::vector<uint64_t> blocks;
  int block_tokens = 0;
  int64_t kv_positions = 0;
  int64_t prompt_tokens = 0;  // 0: unknown (auto then predicts nothing)
};

struct Lease {
  std::string node_id;
  absl::Duration lease;
  absl::Duration heartbeat_interval;
};

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

class NodeRegistry {
 public:
  // `clock` (leases, heartbeats, routing times) outlives the registry.
  explicit NodeRegistry(RegistryOptions options = {}, Clock* clock = Clock::Real());

  // INVALID_ARGUMENT for a request without role, address or models, a consumer without a transfer
  // address, or an artifact whose consumer fingerprint is none of the node's models'. The lease's
  // node id is "<role>-" and 32 random hex digits: only the node it was given to knows it.
  absl::StatusOr<Lease> Register(const v1::RegisterRequest& request);
  // NOT_FOUND when the lease is unknown or lapsed (the node registers again).
  absl::Status Heartbeat(const v1::HeartbeatRequest& request);
  absl::Status Deregister(const std::string& node_id);
  // A node whose liveness an external registry keeps (etcd: its lease there; the coordinator's
  // watch removes it with Deregister when its key goes): added under its own `node_id`, or its
  // registration and state (load, prefix blocks) replaced. It never lapses here.
  // INVALID_ARGUMENT as Register, or for an empty node id.
  absl::Status Upsert(const std::string& node_id, const v1::RegisterRequest& request,
                      const v1::HeartbeatRequest& state);
  // The ids of the nodes added with Upsert.
  std::vector<std::string> ExternalNodeIds() const;
  // Drops every node whose lease lapsed; returns "node_id (role address)" for each, for the log.
  std::vector<std::string> ExpireLapsed();

  // Routes `targets` (consumer model names, at least one, no duplicates) in `mode`.
  // INVALID_ARGUMENT: no target, or a duplicate. NOT_FOUND: a target no consumer
  // ever registered (the message names the live ones; a long name is cut). UNAVAILABLE: a target
  // known from an earlier registration whose nodes are all out of routing (stalled, lapsed), or
  // codes needed but no live producer. FAILED_PRECONDITION: an explicit mode no producer/consumer
  // pair can serve (names the artifacts held). Nodes with leases lapsed but not yet swept are not
  // routed to. `hint` (may be null): the prompt's prefix blocks, for cache-aware routing. `max_kl`
  // (0: none): the request's quality budget (GenerateRequest.max_kl); FAILED_PRECONDITION for
  // explicit scd when no frontier point of the pair is within it. `ttft_slo_ms` (0: none): auto's
  // TTFT objective (GenerateRequest.ttft_slo_ms).
  absl::StatusOr<Route> Resolve(const std::vector<std::string>& targets, RequestedMode mode,
                                const PrefixHint* hint = nullptr, double max_kl = 0,
                                double ttft_slo_ms = 0) const;
  // A request routed on `route` starts (its nodes count it as load until RoutedDone) and will
  // leave `hint`'s blocks in their caches.
  void NoteRouted(const Route& route, const PrefixHint* hint);
  void RoutedDone(const Route& route);
  // Target `target` of `route` (its index) produced its first token: a local prefill no longer
  // holds its consumer's compute (auto's queue ahead of the next local prefill there).
  void NoteFirstToken(const Route& route, size_t target);
  // The shape `producer_node`'s sessions travel under now (Registry.SetLinkShape's answer; gbps
  // 0: unshaped, the link then as measured).
  void NoteLinkShape(const std::string& producer_node, const v1::LinkShape& shape);
  // A target's Finished as its client gets it (the producer's prefill and link filled in): the
  // link's goodput from transfers it held back, and the shape the codes travelled under.
  void ObserveFinished(const Route& route, const RouteTarget& target, const v1::Finished& finished);

  // A live producer as the control plane reaches it.
  struct ProducerNode {
    std::string node_id, name, control_address;
  };
  // Live producers whose node id or a model name equals `match` ("" = every one).
  std::vector<ProducerNode> Producers(const std::string& match) const;

  // Every live model, for Inference.ListModels.
  std::vector<v1::ModelInfo> Models() const;
  size_t size() const;
  const RegistryOptions& options() const { return options_; }
  Clock* clock() const { return clock_; }

 private:
  struct Node {
    std::string id;
    v1::RegisterRequest info;
    absl::Time last_heartbeat;
    uint32_t active_requests = 0;    // as its last heartbeat said
    uint32_t routed = 0;             // requests routed to it, not yet done
    uint32_t routed_since_beat = 0;  // routed to it since its last heartbeat
    // Consumers: as its last heartbeat said, and the bytes of requests routed to it not yet done.
    int64_t kv_reserved = 0, kv_queued = 0, routed_bytes = 0;
    std::set<uint64_t> prefix_blocks;  // routing keys its cache holds (reported + routed since)
    bool has_prefix_cache = false;     // it reports one (else nothing is predicted for it)
    bool external = false;             // Upsert: liveness kept elsewhere (etcd)
    std::map<std::string, Frontier> frontiers;  // by artifact id (consumers), as registered
    v1::NodeSpeeds speeds;                      // as its last heartbeat said
    uint32_t queued_requests = 0;               // consumers: waiting for admission
    uint32_t decoding = 0;                      // consumers: sequences decoding (heartbeat)
    // Consumers: local prefills routed to it and not yet at their first token (route id,
    // target index): the prefill work ahead of another local one. Producers: routes sending
    // codes from it and not yet at their first token (route id, the route's target count).
    std::set<std::pair<uint64_t, size_t>> prefilling;
    std::optional<v1::LinkShape> shape;              // producers: its sessions' shape, when shaped
    absl::Time shape_set = absl::InfinitePast();     // the last NoteLinkShape
    bool shape_announced = false;                    // that one set a shape (else learnt or none)
    absl::Time shape_learnt = absl::InfinitePast();  // the last Finished that set `shape`
  };
  void ApplyState(Node& node, const v1::HeartbeatRequest& state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Live(const Node& node, absl::Time now) const;
  double Load(const Node& node) const;
  // A consumer's KV bytes free as routing sees them (no budget: unlimited).
  static int64_t FreeBytes(const Node& node);
  // Whether `node` cannot take a request needing `need` KV bytes now.
  bool AtCapacity(const Node& node, int64_t need) const;
  // Leading blocks of `hint` the node holds.
  static size_t Matched(const Node& node, const PrefixHint* hint);
  // Routing cost (lower is better) of sending the request to `node`.
  double Cost(const Node& node, const PrefixHint* hint) const;
  // The live consumer node serving `name` with the lowest cost (nullptr: none).
  const Node* PickConsumer(const std::string& name, absl::Time now, const PrefixHint* hint) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The live consumer for each target (PickConsumer); UNAVAILABLE or NOT_FOUND for a target
  // with none, as Resolve says.
  absl::StatusOr<std::vector<const Node*>> PickConsumers(const std::vector<std::string>& targets,
                                                         absl::Time now,
                                                         const PrefixHint* hint) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Resolves one target against one producer (nullptr: none live). Returns an error only for an
  // explicit mode the pair cannot serve.
  absl::StatusOr<RouteTarget> ResolveTarget(const Node& consumer, const std::string& name,
                                            const Node* producer, RequestedMode mode, double max_kl,
                                            double ttft_slo_ms, const PrefixHint* hint,
                                            absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  struct TargetPair;
  // Auto with the nodes' speeds measured: the choice predicted to reach the first token soonest
  // (false: nothing measured to predict with).
  bool ResolveAutoPredicted(const Node& consumer, const Node& producer, const TargetPair& pair,
                            double ttft_slo_ms, const PrefixHint* hint, absl::Time now,
                            RouteTarget* target) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Auto without a prediction: the cheapest frontier point within max_kl (else the recommended
  // one; local when none is within), the raw cache between identical weights, else local.
  static void ResolveAutoUnpredicted(const TargetPair& pair, double ttft_slo_ms,
                                     RouteTarget* target);
  // An explicit mode: an error where the pair cannot serve it.
  absl::Status ResolveExplicit(const Node& consumer, const TargetPair& pair, TransferMode mode,
                               RouteTarget* target) const;
  void ForgetLinks(const std::string& node_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What auto's cost model knows of a request on the pair (auto_choice.h).
  AutoInputs InputsFor(const Node& consumer, const Node& producer, const PrefixHint* hint,
                       absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RegistryOptions options_;
  Clock* const clock_;
  mutable absl::Mutex mu_;
  std::map<std::string, Node> nodes_ ABSL_GUARDED_BY(mu_);
  mutable std::atomic<uint64_t> routes_{0};  // Route ids made so far (Resolve is const)
  // Target names consumers have registered, live or not (UNAVAILABLE rather than NOT_FOUND).
  std::set<std::string> known_targets_ ABSL_GUARDED_BY(mu_);
  // The links auto measured, by (producer node, consumer node).
  std::map<std::pair<std::string, std::string>, LinkEstimate> links_ ABSL_GUARDED_BY(mu_);
};

}  // namespace scd::coordinator

#endif  // SCD_COORDINATOR_NODE_REGISTRY_H_
