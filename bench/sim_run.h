// The cluster simulator's run (bench/cluster_sim.h): its state and the events that advance it,
// private to the simulator's two files of one concept each:
//   - bench/cluster_sim.cc, the nodes' work: arrivals routed, admission, producers' passes, codes
//     on the links, consumers' steps, the end of each request;
//   - bench/sim_failover.cc, the cluster's answer to a node lost (the workload's faults): each
//     coordinator's connection to a frozen node gives up on its keepalive, the real registry
//     ejects the node (NoteUnreachable) and probes it back (TakeDueProbes, NoteProbe), the
//     streams its consumer held move to another replica (ResolveMove), the transfers its producer
//     held fail into their consumers' own prefill.
// A request that leaves a node (a move, a fallback) bumps its epoch: what the node still holds of
// it (a sequence, rebuild work, codes on their way, an admission's answer) is stale from then on,
// dropped where the node next reads it -- a node frozen mid-step drops it at the step's end, as
// the daemon finds its call cancelled at the thaw.
// Thread-safety: not thread-safe (the simulation's one thread).
#ifndef SCD_BENCH_SIM_RUN_H_
#define SCD_BENCH_SIM_RUN_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/simulated_clock.h"
#include "bench/cluster_sim.h"
#include "bench/sim_config.h"
#include "bench/sim_faults.h"
#include "bench/sim_nodes.h"
#include "bench/sim_requests.h"
#include "consumer/admission.h"
#include "consumer/step_plan.h"
#include "coordinator/node_registry.h"

namespace scd::bench::sim {

class Sim {
 public:
  Sim(const SimDeployment& d, const SimWorkload& w) : d_(d), w_(w), requests_(w), rng_(w.seed) {}
  absl::StatusOr<ClusterSimResult> Run(double drain_s);

 private:
  // cluster_sim.cc: the nodes' work.
  void AddNodes();
  void Heartbeat();
  void Arrive(std::unique_ptr<Req> req);
  // Asks `req`'s consumer to admit it (at its thaw when frozen).
  void Admit(Req* req);
  void Admitted(Req* req, uint64_t epoch, Admission::Admitted admitted);
  void Advance(ProducerNode* p);
  void StartPasses(ProducerNode* p);
  void SendLayer(ProducerNode* p, Req* req, int64_t layer);
  void Progress(ProducerNode* p);
  void LayerArrived(Req* req, uint64_t epoch);
  void TakeLayer(Req* req);
  void WorkDone(ConsumerNode* c, const ConsumerNode::Work& w);
  void Kick(ConsumerNode* c);
  void StepDone(ConsumerNode* c, const consumer::StepPlan& plan,
                std::vector<ConsumerNode::Ready> ready, double seconds, double elapsed);
  absl::Status AddFaults();
  // A local prefill of `req` (its prompt, or a moved stream's tokens on top) ran: its first token,
  // or a moved stream's next.
  void PrefillDone(Req* req);
  void Finish(Req* req, absl::StatusCode code);
  double StepSeconds(ConsumerNode* c, const consumer::StepPlan& plan,
                     const std::vector<ConsumerNode::Ready>& ready);
  void Account(ConsumerNode* c, const consumer::StepPlan& plan, double seconds);
  double IdleUs(absl::Time since) const;
  double IdleFactor(const IdleCost& idle, absl::Time since);
  void At(absl::Time when, std::function<void()> fire) {
    ++events_;
    clock_.At(when, std::move(fire));
  }
  // When `spans` hold now (a frozen node): `fire` set for their thaw, and true.
  bool AtThaw(const FrozenSpans& spans, std::function<void()> fire) {
    const absl::Time now = clock_.Now(), thaw = spans.ThawOf(now);
    if (thaw <= now) return false;
    At(thaw, std::move(fire));
    return true;
  }

  // A node by its name: its consumer or its producer, the other null (both: none so named).
  struct NodeRef {
    ConsumerNode* consumer = nullptr;
    ProducerNode* producer = nullptr;
    FrozenSpans& frozen() const {
      return consumer != nullptr ? consumer->frozen : producer->frozen;
    }
    FrozenSpans& down() const { return consumer != nullptr ? consumer->down : producer->down; }
  };
  NodeRef NodeNamed(const std::string& name) const;

  // sim_failover.cc: the cluster's answer to a node lost.
  // Sets a fault's consequences: a freeze's keepalives that give up on the node and transfers
  // lost; a kill, the node's lapse if it stays down past the lease, and its restart.
  void ScheduleFailover(const SimFault& fault, absl::Time from, absl::Time to);
  // `node` killed (kill -9): its connections reset at once, so every coordinator ejects it, its
  // streams move and its transfers fall back; what it held is gone.
  void Kill(const std::string& node);
  // Its etcd key lapsed while it was down: every coordinator's watch deregisters it.
  void Lapse(const std::string& node);
  // `node` restarted, empty: registered anew (in routing at once), its caches and speeds fresh.
  void Restart(const std::string& node);
  // A killed consumer's or producer's state as a new process has it.
  void Wipe(ConsumerNode* c);
  void Wipe(ProducerNode* p);
  // Coordinator `k`'s connection to `node` gave up on it: ejected there, its streams moved, its
  // transfers failed.
  void NodeLost(size_t k, const std::string& node);
  // Coordinator `k` takes `node` out of routing for `why` and probes it.
  void Eject(size_t k, const std::string& node, const std::string& why);
  // What coordinator `k` (kAll: every one) routed to `node`, lost: streams on a consumer move,
  // transfers from a producer fall back.
  void Strand(size_t k, const NodeRef& node);
  // The transfer sessions of producer `p`'s passes running now gave up on it: each falls back.
  void TransfersLost(ProducerNode* p);
  // Coordinator `k`'s prober: the probes due now, each answered (or timed out) on the clock.
  void Probe(size_t k);
  // `req` leaves its producer's queue or pass; false when none holds it (its codes all sent).
  bool LeaveProducer(Req* req);
  // `req`'s stream moves off its consumer (routed_request.h `move`): UNAVAILABLE when no replica.
  void Move(Req* req);
  // `req`'s transfer failed: its consumer prefills the prompt itself.
  void FallBack(Req* req);
  // Drops what `c` holds of requests that left it (not while it steps).
  void Purge(ConsumerNode* c);
  // The live requests of coordinator `k` (kAll: of every one) that `pick` picks, by id.
  static constexpr size_t kAll = ~size_t{0};
  std::vector<Req*> LiveOf(size_t k, const std::function<bool(const Req&)>& pick) const;

  const SimDeployment& d_;
  const SimWorkload& w_;
  SimRequests requests_;
  std::mt19937_64 rng_;  // the idle slowdowns' and step noise's draws, in the events' order
  SimulatedClock clock_;
  absl::Time start_;
  std::vector<std::unique_ptr<coordinator::NodeRegistry>> registries_;
  std::vector<bool> probing_;  // a coordinator's prober has its next round set
  std::vector<std::unique_ptr<ConsumerNode>> consumers_;
  std::vector<std::unique_ptr<ProducerNode>> producers_;
  std::unordered_map<std::string, ConsumerNode*> consumer_by_id_;
  std::unordered_map<std::string, ProducerNode*> producer_by_id_;
  std::unordered_map<uint64_t, std::unique_ptr<Req>> live_;
  // Ended requests that left a node, which may still hold stale entries of them (freed at the end).
  std::vector<std::unique_ptr<Req>> left_nodes_;
  std::vector<SimRequestResult> results_;
  int64_t events_ = 0;
  bool arrivals_done_ = false;
  bool ending_ = false;  // past the drain: what is left ends DEADLINE_EXCEEDED
};

}  // namespace scd::bench::sim

#endif  // SCD_BENCH_SIM_RUN_H_
