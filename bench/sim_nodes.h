// The cluster simulator's nodes and requests (bench/cluster_sim.h): what a simulated producer
// and consumer hold -- the daemons' own Admission and StepPacer, a NodeSpeedTracker, a prefix
// cache that is the real PrefixBlockCache over blocks of bytes only -- what they register with a
// coordinator (a consumer's artifact carrying the pool pair's codes as its frontier's one point),
// and a request's state as events advance it.
// Thread-safety: not thread-safe (the simulation's one thread owns them).
#ifndef SCD_BENCH_SIM_NODES_H_
#define SCD_BENCH_SIM_NODES_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "base/clock.h"
#include "base/prefix_block_cache.h"
#include "base/prefix_hash.h"
#include "bench/cluster_sim.h"
#include "bench/sim_config.h"
#include "bench/sim_faults.h"
#include "bench/sim_requests.h"
#include "consumer/admission.h"
#include "consumer/step_log.h"
#include "consumer/step_pacer.h"
#include "consumer/step_plan.h"
#include "coordinator/route_choice.h"
#include "proto/node_speeds.h"
#include "scd/v1/registry.pb.h"

namespace scd::bench::sim {

using consumer::Admission;

constexpr int64_t kBlock = kPrefixBlockTokens;
constexpr size_t kReportedBlocks = 65536;  // proto/registry_client.h kReportedPrefixBlocks

// A simulated cache block: its bytes only (the real cache's mechanism, base/prefix_block_cache.h,
// keeps the chains, the budget and the LRU order).
struct SimBlock {
  int64_t size = 0;
  int64_t bytes() const { return size; }
};
using BlockCache = PrefixBlockCache<SimBlock>;

// A node's prefix cache of `mb` MiB at `bytes_per_token` (none when either is 0).
std::unique_ptr<BlockCache> CacheOf(double mb, int64_t bytes_per_token, Clock* clock);
// A consumer of `pool`'s admission (its capacity and KV budget) on `clock`.
std::shared_ptr<Admission> AdmissionOf(const SimConsumerPool& pool, Clock* clock);

struct Req;

struct ConsumerNode {
  std::string id;
  size_t pool = 0;
  const SimConsumerPool* spec = nullptr;
  v1::RegisterRequest info;
  std::shared_ptr<Admission> admission;
  consumer::StepPacer pacer{2.0, 64};
  // The daemon's account of its steps (consumer/step_log.h), on the simulated clock.
  std::optional<consumer::StepLog> step_log;
  struct Seq {
    Req* req = nullptr;
    uint64_t epoch = 0;  // its request's when it came (Stale)
    bool decoding = false;
    // Local positions to run / run (the prompt's; a moved stream's tokens after its prompt), and
    // where the run began (its first chunk pays the prefill's fixed cost).
    int64_t prompt_left = 0, prompt_done = 0, start = 0;
    int64_t context = 0;  // positions in its cache
  };
  std::vector<Seq> seqs;
  // Rebuild work in the scheduler's queue, as the daemon's receive hands it in
  // (consumer/code_receiver.h): a layer's rows, then the prompt's last token through that layer
  // (the tail, one row), and after the last layer the last logits (one row, no layer); a request's
  // next layer is taken only once its tail ran, so each layer costs its own steps.
  enum class Kind { kLayer, kTail, kLogits };
  struct Work {
    Req* req = nullptr;
    uint64_t epoch = 0;
    Kind kind = Kind::kLayer;
    int64_t rows = 0, rows_left = 0;
    bool raw = false;  // raw KV: copied, not priced against the step's budget
    // The model layers a row covers, as the planner counts them (step_plan.h PlannedWork).
    int layers() const { return kind == Kind::kLogits || raw ? 0 : 1; }
  };
  std::deque<Work> work;
  struct Ready {
    Req* req = nullptr;
    uint64_t epoch = 0;
  };
  std::vector<Ready> ready;  // caches complete, their first decode due
  bool stepping = false;
  FrozenSpans frozen;         // its freezes (the workload's faults)
  FrozenSpans down;           // killed until its restart (the workload's faults)
  uint64_t life = 0;          // its restarts: a step of an earlier life never ends
  bool kick_at_thaw = false;  // a Kick while frozen set one for the thaw
  double pieces_s = 0;  // the step in flight's rebuild pieces, seconds (its step log's)
  // Nothing to step since idle_since (InfinitePast: since the run began): the next step pays the
  // profile's idle slowdown.
  bool idle = true;
  absl::Time idle_since = absl::InfinitePast();
  std::optional<NodeSpeedTracker> speeds{std::in_place};  // anew at a restart
  consumer::ItlCost rebuild_itl;
  consumer::RebuildPrice price;  // the pieces' price, learnt from their charged cost
  std::unique_ptr<BlockCache> cache;
  SimNodeUse use;
};

struct ProducerNode {
  std::string id;
  size_t pool = 0;
  const SimProducerPool* spec = nullptr;
  v1::RegisterRequest info;
  int64_t kv_bytes_per_token = 0;  // its consumers' (its prefix cache's blocks)
  std::deque<Req*> queue;  // waiting for a pass (spec->prefill_threads run at once)
  // A prefill running: its cost alone (the profile's, microseconds) and how much of it is done;
  // the passes running share the node's compute equally (processor sharing), as the daemon's
  // prefill threads share its CPU.
  struct Pass {
    Req* req = nullptr;
    int64_t tokens = 0;  // computed (not cached)
    double work_us = 0, done_us = 0;
    int64_t layers_out = 0;
    absl::Time start;
  };
  std::vector<Pass> passes;
  absl::Time updated;       // the passes' done_us as of then
  uint64_t generation = 0;  // a scheduled progress event of an older generation is stale
  absl::Time idle_since = absl::InfinitePast();  // when it last had no pass; see ConsumerNode
  absl::Time link_free = absl::InfinitePast();
  FrozenSpans frozen;  // its freezes (the workload's faults)
  FrozenSpans down;    // killed until its restart
  std::optional<NodeSpeedTracker> speeds{std::in_place};  // anew at a restart
  std::unique_ptr<BlockCache> cache;
  SimNodeUse use;
};

struct Req {
  SimRequest r;
  const SimMix* mix = nullptr;
  size_t coordinator = 0;
  coordinator::Route route;
  // Bumped each time the request leaves a node (a move, a fallback): entries a node holds of an
  // older epoch are stale (bench/sim_run.h).
  uint64_t epoch = 0;
  TransferMode mode = TransferMode::kLocal;  // as it runs now (local after a fallback)
  bool fell_back = false;
  // A moved stream's: the replicas given up, and the routes its moves took (each counted as load
  // until the request ends, as the coordinator's moved calls are).
  std::set<std::string> given_up;
  std::vector<coordinator::Route> moved_routes;
  coordinator::PrefixHint hint;
  ConsumerNode* consumer = nullptr;
  ProducerNode* producer = nullptr;
  std::unique_ptr<Admission::Reservation> reservation;
  absl::Time arrival, first_token = absl::InfinitePast();
  int64_t tokens = 0, sent = 0, layers_in = 0;
  // The receive: layers taken into rebuild (each after the one before ran through its tail), and
  // whether one is in the consumer's queue now.
  int64_t layers_taken = 0;
  bool receiving = false;
  double prefill_us = 0, transfer_us = 0, rebuild_us = 0, first_decode_us = 0;
  double api_us = 0;  // the front end's hop, by its consumer's idle when it arrived
  absl::Time first_byte = absl::InfinitePast();
  SimRequestResult* result = nullptr;
};

v1::RegisterRequest ProducerInfo(const SimProducerPool& pool, const std::string& id);
v1::RegisterRequest ConsumerInfo(const SimConsumerPool& pool, const std::string& id);
// A node's heartbeat as its daemon sends it: load, KV memory, the speeds it measured, its prefix
// blocks (at most kReportedBlocks).
v1::HeartbeatRequest HeartbeatOf(const ProducerNode& p);
v1::HeartbeatRequest HeartbeatOf(const ConsumerNode& c);

// The cache keys of `req`'s blocks (a chain: a block's key names every block before it), a
// consumer's per mode (what it rebuilt from codes is not its own prefill's); "" mode: a
// producer's.
std::vector<std::string> KeysFor(const Req& req, const std::string& mode);
// Prompt positions of `req` the cache holds (and now marks used; null: none): at most the prompt
// less its last token (which is always run).
int64_t Cached(BlockCache* cache, const Req& req, const std::string& mode);
// A rebuild piece of `rows` rows of `w`, microseconds by the consumer's profile `k` (a model of
// `layers` layers): the daemon's receive's work, each kind as sim_nodes.cc says.
double PieceUs(const NodeProfile& k, int64_t layers, const ConsumerNode::Work& w, int64_t rows);
// What `req`'s consumer reports when it ends OK at `now` (its `res`: the mode it ran, what was
// cached): the coordinator's and the tracker's input, as a real consumer's Finished.
v1::Finished FinishedOf(const Req& req, const SimRequestResult& res, absl::Time now);

// Whether an entry a node took at `epoch` is of a request that left it since.
inline bool Stale(const Req* req, uint64_t epoch) { return req->epoch != epoch; }

// Puts `req`'s blocks into the cache (what its pass or rebuild left there; null: nothing).
void Keep(BlockCache* cache, const Req& req, const std::string& mode, int64_t bytes_per_token);

}  // namespace scd::bench::sim

#endif  // SCD_BENCH_SIM_NODES_H_
