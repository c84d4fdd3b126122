// NodeRegistry: the coordinator's view of the serving nodes -- membership and leases, and the
// load routing has added to them -- and the front of routing, in four files of one concept each:
//   - here, membership and leases: producers and consumers register (scd.v1.Registry) and hold a
//     lease they renew by heartbeating; a node whose lease lapses leaves routing at the next
//     ExpireLapsed (the coordinator sweeps every RegistryOptions::sweep_interval, so a silent
//     node is gone within lease + sweep); nodes whose liveness etcd keeps come through Upsert.
//     NoteRouted / NoteFirstToken / RoutedDone account the requests routed to each node until
//     its next heartbeat reports them, and what they will leave in its prefix cache (only for
//     nodes that report a cache, never past kReportedPrefixBlocks per node), so a second request
//     right behind the first follows it;
//   - coordinator/registered_node.h: what is kept of a node, and its load and routing cost;
//   - coordinator/route_choice.h: Resolve's policy (which producer, consumer and mode per target);
//   - coordinator/link_book.h: the links as announced, learnt and measured (its own lock).
// Thread-safety: thread-safe; one mutex over the nodes (the clock is called under it, route
// choice runs under it on a const view); the link book's lock is taken after it, never before.
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
#include "coordinator/link_book.h"
#include "coordinator/registered_node.h"
#include "coordinator/route_choice.h"
#include "proto/registry_client.h"
#include "scd/v1/inference.pb.h"
#include "scd/v1/registry.pb.h"

namespace scd::coordinator {

struct Lease {
  std::string node_id;
  absl::Duration lease;
  absl::Duration heartbeat_interval;
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
  // TTFT objective (GenerateRequest.ttft_slo_ms). `local_fallback`: the request allows its
  // consumer's own prefill when the transfer fails (proto/request_validation.h
  // LocalFallbackAllowed), so an explicit transfer mode with no live producer routes local, saying
  // why, instead of UNAVAILABLE.
  absl::StatusOr<Route> Resolve(const std::vector<std::string>& targets, RequestedMode mode,
                                const PrefixHint* hint = nullptr, double max_kl = 0,
                                double ttft_slo_ms = 0, bool local_fallback = false) const;
  // A moved stream's route (GenerateEvent.Moved): `target` on a live consumer that `move` allows
  // (not a node given up, the same weights), least loaded first, in `mode`: local prefill of the
  // prompt and the tokens streamed so far (its prefix cache serves what it holds; no producer),
  // or a transfer's codes for the prompt from a live producer of the model, the streamed tokens
  // prefilled on top. UNAVAILABLE when no such replica (or producer) is live.
  absl::StatusOr<Route> ResolveMove(const std::string& target, const MoveConstraint& move,
                                    TransferMode mode = TransferMode::kLocal) const;
  // A takeover's producer for a transfer to `consumer_node` whose producer was lost
  // (route_choice.h ChooseTakeoverProducer): the same model (`fingerprint`), none of `exclude`.
  absl::StatusOr<TakeoverCandidate> ResolveTakeover(const std::string& consumer_node,
                                                    const std::string& fingerprint,
                                                    const std::set<std::string>& exclude) const;
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

  // Fast ejection (coordinator/node_ejection.h). A call to `node_id` failed with a connection
  // error (`why`): out of routing on this coordinator at once (a node unknown here: nothing).
  void NoteUnreachable(const std::string& node_id, const std::string& why);
  // A node out of routing whose probe is due now, as the prober reaches it.
  struct DueProbe {
    std::string node_id, address;
    v1::NodeRole role = v1::NODE_ROLE_UNSPECIFIED;
  };
  // The probes due now; each is under way until NoteProbe.
  std::vector<DueProbe> TakeDueProbes();
  // `node_id`'s probe answered (`ok`: in time); after kProbesToReturn in a row it is back. A
  // suspect node's failed probe ejects it.
  void NoteProbe(const std::string& node_id, bool ok);
  // Another coordinator (`from`) ejected `node_id` (`why`): suspect here, probed at once, in
  // routing until its probe fails. Nothing for a node unknown here or out already.
  void NoteAdvice(const std::string& node_id, const std::string& from, const std::string& why);
  // Called (outside the lock, on the thread that ejected) with each node this coordinator takes
  // out of routing on its own evidence -- a failed call, or a suspect's failed probe -- so others
  // can be told. One listener; set before serving, nullptr to stop.
  using EjectionListener = std::function<void(const std::string& node_id, const std::string& why)>;
  void SetEjectionListener(EjectionListener listener);
  // What fast ejection did here since the start: nodes taken out on this coordinator's own
  // evidence and back, advice heard and what the probes made of it (Stats, metrics, tests).
  struct EjectionCounts {
    uint64_t ejected = 0, returned = 0;
    uint64_t advice_heard = 0, advice_cleared = 0, advice_confirmed = 0;
  };
  EjectionCounts ejection_counts() const;
  // Whether `node_id` is out of routing after a failed call (false: in, or unknown).
  bool Ejected(const std::string& node_id) const;
  // How many nodes are out now (NodeStats.nodes_out).
  uint32_t NodesOut() const;

  // A live producer as the control plane reaches it.
  struct ProducerNode {
    std::string node_id, name, control_address;
  };
  // Live producers whose node id or a model name equals `match` ("" = every one).
  std::vector<ProducerNode> Producers(const std::string& match) const;

  // Every model routed to, for Inference.ListModels: a live node's, unless it is out of routing
  // (fast ejection) -- what a client or harness reads to see a node out or back.
  std::vector<v1::ModelInfo> Models() const;
  size_t size() const;
  // Waits until at least `nodes` are registered (a registration wakes it) or the registry's clock
  // reaches `deadline`; returns whether they are.
  bool AwaitSize(size_t nodes, absl::Time deadline) const;
  const RegistryOptions& options() const { return options_; }
  Clock* clock() const { return clock_; }

 private:
  using Node = RegisteredNode;

  const RegistryOptions options_;
  Clock* const clock_;
  mutable absl::Mutex mu_;
  NodeMap nodes_ ABSL_GUARDED_BY(mu_);
  mutable std::atomic<uint64_t> routes_{0};  // Route ids made so far (Resolve is const)
  // Target names consumers have registered, live or not (UNAVAILABLE rather than NOT_FOUND).
  std::set<std::string> known_targets_ ABSL_GUARDED_BY(mu_);
  EjectionListener ejection_listener_ ABSL_GUARDED_BY(mu_);
  EjectionCounts ejection_counts_ ABSL_GUARDED_BY(mu_);
  LinkBook links_;
};

}  // namespace scd::coordinator

#endif  // SCD_COORDINATOR_NODE_REGISTRY_H_
