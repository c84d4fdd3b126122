// RegisteredNode: what the coordinator's registry keeps of one serving node (its registration,
// the state its heartbeats report, what routing has added since), and the load accounting on it
// -- plain functions of that state, so routing and its tests read one definition:
//   load = a producer's active requests (the larger of its heartbeat's count and the requests
//   routed to it and not yet done); a consumer's KV memory in use as a share of its budget, in
//   requests (used / budget x capacity), where used is the larger of the bytes its heartbeat
//   reported reserved and queued and the bytes of the requests routed to it and not yet done.
//   cost = blocks to compute + load_weight * load * prompt blocks (+ a wall at capacity), as
//   Dynamo's KV router costs a cache overlap against active work.
// Also the registry's options, which each of its parts (node_registry.h membership and leases,
// route_choice.h, link_book.h) reads.
// Thread-safety: plain data and pure functions; the registry's lock guards its nodes.
#ifndef SCD_COORDINATOR_REGISTERED_NODE_H_
#define SCD_COORDINATOR_REGISTERED_NODE_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "codec/frontier.h"
#include "coordinator/node_ejection.h"
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
  // The coordinator's tokenizer (Tokenizer::fingerprint; "": it has none and checks nothing): a
  // node registering with another is refused.
  std::string tokenizer_fingerprint = {};
};

// What routing knows of a request's prompt: the routing keys of its prefix's full blocks, and
// the positions its KV cache will hold (prompt + max_tokens; 0: unknown).
struct PrefixHint {
  std::vector<uint64_t> blocks;
  int block_tokens = 0;
  int64_t kv_positions = 0;
  int64_t prompt_tokens = 0;  // 0: unknown (auto then predicts nothing)
};

struct RegisteredNode {
  std::string id;
  v1::RegisterRequest info;
  absl::Time last_heartbeat;
  uint32_t active_requests = 0;    // as its last heartbeat said
  uint32_t routed = 0;             // requests routed to it, not yet done
  uint32_t routed_since_beat = 0;  // routed to it since its last heartbeat
  // Consumers: as its last heartbeat said, and the bytes of requests routed to it not yet done.
  int64_t kv_reserved = 0, kv_queued = 0, routed_bytes = 0;
  // Routing keys its cache holds (reported + routed since); a hash set: every route looks up
  // every node's.
  absl::flat_hash_set<uint64_t> prefix_blocks;
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
  // Out of routing on this coordinator after a failed call, until its probe passes.
  Ejection ejection;
};

// Nodes by id.
using NodeMap = std::map<std::string, RegisteredNode>;

// OK, or INVALID_ARGUMENT for a request without role, address or models, a consumer without a
// transfer address, or an artifact whose consumer fingerprint is none of the node's models' (or
// whose frontier does not parse).
// FAILED_PRECONDITION when the node's tokenizer fingerprint is set and differs from
// `tokenizer_fingerprint` (also set).
absl::Status ValidateRegistration(const v1::RegisterRequest& request,
                                  const std::string& tokenizer_fingerprint = "");
// A node of a validated registration (`id`, its frontiers by artifact id), heard from at `now`.
RegisteredNode NodeOf(std::string id, const v1::RegisterRequest& request, absl::Time now);
// A heartbeat's report: load, KV memory, speeds, prefix blocks (at most kReportedPrefixBlocks).
void ApplyState(const v1::HeartbeatRequest& state, RegisteredNode* node);

// Whether it is registered and alive at `now`: external, or heard from within `lease`.
bool Live(const RegisteredNode& node, absl::Time now, absl::Duration lease);
// Whether routing may use it at `now`: live, and not ejected (node_ejection.h).
bool Routable(const RegisteredNode& node, absl::Time now, absl::Duration lease);
// A consumer's KV bytes free as routing sees them (no budget: unlimited).
int64_t FreeBytes(const RegisteredNode& node);
double Load(const RegisteredNode& node);
// Whether it cannot take a request needing `need` KV bytes now.
bool AtCapacity(const RegisteredNode& node, int64_t need);
// Leading blocks of `hint` (may be null) it holds.
size_t Matched(const RegisteredNode& node, const PrefixHint* hint);
// Routing cost (lower is better) of sending the request to it.
double RoutingCost(const RegisteredNode& node, const PrefixHint* hint, double load_weight);

const char* RoleName(v1::NodeRole role);
std::string ShortFingerprint(const std::string& fingerprint);  // for messages

}  // namespace scd::coordinator

#endif  // SCD_COORDINATOR_REGISTERED_NODE_H_
