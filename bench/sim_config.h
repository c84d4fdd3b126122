// The cluster simulator's two inputs (issue 51), each one TOML file, read by the rules of
// bench/bounded_toml.h (bounded, every key known, errors naming the key):
//
// A deployment: what runs, where, at what cost.
//   [deployment]        name, coordinators, lease_s (etcd's), heartbeat_ms
//   [[producer_pool]]   name (the model name routing knows), profile (a node profile file,
//                       relative to the deployment's folder), count, prefix_cache_mb,
//                       prefill_threads, restart_s (a killed node's restart until ready)
//   [[consumer_pool]]   name (the routing name requests target), profile, count,
//                       prefix_cache_mb, restart_s, producer (the producer pool whose codes it
//                       translates;
//                       "": it prefills locally only), code_bytes_per_token and code_kl (the
//                       pair's codes, its artifact's chosen frontier point), layers (the
//                       model's: codes travel and are rebuilt layer by layer)
//   [[link]]            producer, consumer (pools), gbps, latency_us, trace (a bandwidth trace
//                       file, bench/link_trace.h, relative to the deployment's folder: the
//                       link's rate over simulated time instead of gbps; "": none) -- a pair
//                       without one uses the producer profile's measured link
// A workload: what arrives.
//   [workload]          duration_s, seed, rate (requests/s), arrivals ("poisson" | "gamma" |
//                       "constant"), burstiness (gamma's shape)
//   [prompt], [output]  lengths in tokens: distribution ("fixed" | "uniform" | "lognormal"),
//                       tokens (fixed), min and max (uniform; lognormal's clamp), mean and sigma
//                       (lognormal: the median is mean * exp(-sigma^2 / 2))
//   [prefix]            groups (shared-prefix groups; 0: none), share (of each prompt: the
//                       group's prefix), tenants (cache salts: groups are per tenant)
//   [[mix]]             target (a consumer pool), mode ("auto" | "local" | "raw" | "scd"),
//                       weight
//   [slo]               ttft_ms, tpot_ms (goodput's bounds; 0: none), objective_ttft_ms (auto's
//                       ttft_slo_ms on each request; 0: none)
//   [[fault]]           the soak's faults replayed (bench/sim_faults.h): kind ("freeze" |
//                       "kill"; the soak's others are refused, not simulated yet), node (a
//                       producer or consumer as the simulator names it, POOL-I: "fables-0"),
//                       at_s (since the start, within duration_s), hold_s (a freeze's, shorter
//                       than the deployment's lease; a kill's time down before its restart
//                       begins, which may pass the lease: its registration lapses); at most 64,
//                       one node's not overlapping (a kill's span with its pool's restart_s)
// Thread-safety: values and stateless functions.
#ifndef SCD_BENCH_SIM_CONFIG_H_
#define SCD_BENCH_SIM_CONFIG_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/link_trace.h"
#include "bench/node_profile.h"
#include "codec/transfer_mode.h"

namespace scd::bench {

constexpr size_t kMaxSimFileBytes = 64 << 10;
constexpr int64_t kMaxSimPools = 64;
constexpr int64_t kMaxSimNodes = 100000;  // over every pool
constexpr int64_t kMaxSimTokens = 1 << 20;

struct SimProducerPool {
  std::string name, profile;
  NodeProfile costs;
  int64_t count = 1;
  double prefix_cache_mb = 0;
  // Passes a producer runs at once, sharing its compute (the daemon's --prefill-threads).
  int64_t prefill_threads = 8;
  double restart_s = 0;  // a killed node's restart until it is ready (its model loaded)
};

struct SimConsumerPool {
  std::string name, profile;
  NodeProfile costs;
  int64_t count = 1;
  double prefix_cache_mb = 0;
  std::string producer;  // "": local prefill only
  double code_bytes_per_token = 0, code_kl = 0;
  int64_t layers = 1;
  double restart_s = 0;  // a killed node's restart until it is ready (its model loaded)
};

struct SimLink {
  std::string producer, consumer;
  double gbps = 0, latency_us = 0;                      // gbps: without a trace
  std::string trace;                                    // the file as written
  std::shared_ptr<const std::vector<TraceStep>> steps;  // its steps (null: no trace)
};
constexpr size_t kMaxTraceFileBytes = 1 << 20;

struct SimDeployment {
  std::string name;
  int64_t coordinators = 1;
  double lease_s = 10, heartbeat_ms = 500;
  std::vector<SimProducerPool> producers;
  std::vector<SimConsumerPool> consumers;
  std::vector<SimLink> links;
  // The link of a (producer pool, consumer pool) pair: its [[link]], else one made of the
  // producer profile's measured link. Pools by index.
  SimLink LinkOf(size_t producer, size_t consumer) const;
  int64_t nodes() const;
};

// Reads a profile named in a deployment (the path as written, joined to the deployment's
// folder): ReadNodeProfile by default; tests and the fuzzer give profiles of their own.
using ProfileLoader = std::function<absl::StatusOr<NodeProfile>(const std::string& path)>;
// Reads a link's trace (the path joined as a profile's): the file, bounded and parsed, by default.
using TraceLoader = std::function<absl::StatusOr<std::vector<TraceStep>>(const std::string& path)>;

// The deployment in `text`; `dir` is the folder profile paths are relative to. INVALID_ARGUMENT
// naming the key, pool or reference that is wrong (a profile of the wrong role, a pool named
// twice, a consumer's producer or a link's pool that is none, more than kMaxSimNodes nodes).
absl::StatusOr<SimDeployment> ParseSimDeployment(std::string_view text, const std::string& dir,
                                                 const ProfileLoader& load = nullptr,
                                                 const TraceLoader& load_trace = nullptr);
absl::StatusOr<SimDeployment> ReadSimDeployment(const std::string& path);
// The deployment as a file ParseSimDeployment reads back to the same values (numbers to 17
// digits; each pool's profile path as it is in `d`, so a caller writing it elsewhere sets them
// relative to there first). `comment`: lines put at the top, each after "# ".
std::string SimDeploymentToml(const SimDeployment& d, const std::string& comment = "");

enum class SimArrivals { kPoisson, kGamma, kConstant };
enum class SimLengthKind { kFixed, kUniform, kLogNormal };

struct SimLengths {
  SimLengthKind kind = SimLengthKind::kFixed;
  int64_t tokens = 128, min = 1, max = 1024;
  double mean = 128, sigma = 0.5;
};

struct SimMix {
  std::string target;
  RequestedMode mode;
  double weight = 1;
};

// The soak's faults the simulator replays (bench/sim_faults.h): a freeze (SIGSTOP for hold_s, then
// SIGCONT) and a kill (kill -9, the node restarted hold_s later, empty: its caches, its speeds).
enum class SimFaultKind { kFreeze, kKill };

struct SimFault {
  SimFaultKind kind = SimFaultKind::kFreeze;
  std::string node;  // POOL-I
  double at_s = 0, hold_s = 3;
};

struct SimWorkload {
  double duration_s = 60;
  uint64_t seed = 1;
  double rate = 1;
  SimArrivals arrivals = SimArrivals::kPoisson;
  double burstiness = 1;
  SimLengths prompt, output;
  int64_t prefix_groups = 0, tenants = 1;
  double prefix_share = 0;
  std::vector<SimMix> mix;
  double ttft_slo_ms = 0, tpot_slo_ms = 0, objective_ttft_ms = 0;
  std::vector<SimFault> faults;  // by at_s
};

// The workload in `text` (INVALID_ARGUMENT naming what is wrong). A mix target is checked
// against a deployment by CheckSimWorkload.
absl::StatusOr<SimWorkload> ParseSimWorkload(std::string_view text);
absl::StatusOr<SimWorkload> ReadSimWorkload(const std::string& path);
// INVALID_ARGUMENT naming a mix target that is no consumer pool of `deployment`, a mode the
// pool cannot serve (scd or raw without a producer), or a fault's node that is none of its nodes,
// a freeze as long as its lease (a kill's node may stay down past it: its registration lapses),
// or a fault overlapping another of the node's.
absl::Status CheckSimWorkload(const SimWorkload& workload, const SimDeployment& deployment);
// Whether a finished request's TTFT and TPOT (seconds) meet the workload's SLOs (goodput's).
bool MeetsSlo(const SimWorkload& w, double ttft_s, double tpot_s);
// A node named as the simulator names them (POOL-I): whether it is a producer and its pool and
// index; NOT_FOUND naming it when `deployment` has none so named.
struct SimNodeRef {
  bool producer = false;
  size_t pool = 0;
  int64_t index = 0;
};
absl::StatusOr<SimNodeRef> FindSimNode(const SimDeployment& deployment, const std::string& node);
// How long `fault` keeps its node out: a freeze its hold; a kill its hold (down) and its pool's
// restart_s (starting). `node` is FindSimNode's answer for the fault's node.
double SimFaultSpan(const SimDeployment& deployment, const SimNodeRef& node, const SimFault& fault);

}  // namespace scd::bench

#endif  // SCD_BENCH_SIM_CONFIG_H_
