// The cluster's answer to a node lost, on simulated time (bench/sim_run.h). What the real
// daemons do, each step through the code that does it:
//   - a coordinator's connection to a frozen node gives up on its keepalive
//     (coordinator/node_ejection.h kNodeKeepalive, kNodeKeepaliveTimeout): the node is out of that
//     coordinator's routing (NodeRegistry::NoteUnreachable) and probed every kProbeInterval
//     (TakeDueProbes; a probe the frozen node cannot answer within kProbeTimeout fails, one after
//     its thaw passes: NoteProbe) until kProbesToReturn pass in a row;
//   - the consumer's streams on that coordinator move (coordinator/routed_request.h `move`): to a
//     live replica the registry picks (ResolveMove, the replicas given up excluded), from codes in
//     their mode where the stream began from codes and a producer is live (the prompt's codes
//     rebuilt, the tokens streamed so far prefilled on top), else local (prompt and tokens), at
//     most the coordinator's migration limit; none left: the request ends UNAVAILABLE. The frozen
//     consumer frees what it held at its thaw, when it finds the calls cancelled;
//   - a producer's transfers under way fail on their sessions' keepalive (the gRPC transport's,
//     transport/transport.h) and the transfers not started on the coordinator's: each consumer
//     prefills the prompt itself (the fallback), what it rebuilt dropped. The takeover by another
//     producer of the model (coordinator/producer_takeover.h) is not simulated yet;
//   - a killed node's connections reset at once: every coordinator ejects it then, its streams
//     move and its transfers fall back as above, its probes are refused; its etcd key lapses
//     after the lease (every coordinator deregisters it) unless its restart came first; restarted
//     and ready (the fault's hold_s, then its pool's restart_s), it registers anew -- in routing
//     at once -- with empty caches, no speeds measured and a fresh scheduler.
// Advice between coordinators (etcd) is not simulated: every coordinator's connection gives up
// at the same time here (one grid from the run's start), so none would be first.
#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "bench/sim_run.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/node_ejection.h"
#include "transport/transport.h"

namespace scd::bench::sim {

void Sim::ScheduleFailover(const SimFault& fault, absl::Time from, absl::Time to) {
  const std::string node = fault.node;
  if (fault.kind == SimFaultKind::kKill) {
    At(from, [this, node] { Kill(node); });
    const absl::Time lapse = from + absl::Seconds(d_.lease_s);
    if (lapse < to) At(lapse, [this, node] { Lapse(node); });
    At(to, [this, node] { Restart(node); });
    return;
  }
  const std::optional<absl::Time> lost = KeepaliveGivesUp(
      start_, coordinator::kNodeKeepalive, coordinator::kNodeKeepaliveTimeout, from, to);
  if (lost.has_value()) {
    for (size_t k = 0; k < registries_.size(); ++k) {
      At(*lost, [this, k, node] { NodeLost(k, node); });
    }
  }
  ProducerNode* p = NodeNamed(node).producer;
  if (p == nullptr) return;
  const transport::TransportOptions sessions;
  const std::optional<absl::Time> sessions_lost = KeepaliveGivesUp(
      start_, sessions.grpc_keepalive_interval, sessions.grpc_keepalive_timeout, from, to);
  if (sessions_lost.has_value()) {
    At(*sessions_lost, [this, p] { TransfersLost(p); });
  }
}

std::vector<Req*> Sim::LiveOf(size_t k, const std::function<bool(const Req&)>& pick) const {
  std::vector<Req*> out;
  for (const auto& [id, req] : live_) {
    if ((k == kAll || req->coordinator == k) && pick(*req)) out.push_back(req.get());
  }
  std::sort(out.begin(), out.end(), [](Req* a, Req* b) { return a->r.id < b->r.id; });
  return out;
}

void Sim::NodeLost(size_t k, const std::string& node) {
  Eject(k, node, "keepalive watchdog timeout");
  Strand(k, NodeNamed(node));
}

void Sim::Eject(size_t k, const std::string& node, const std::string& why) {
  registries_[k]->NoteUnreachable(node, why);
  if (!probing_[k]) Probe(k);
}

void Sim::Strand(size_t k, const NodeRef& node) {
  if (ConsumerNode* c = node.consumer; c != nullptr) {
    for (Req* req : LiveOf(k, [c](const Req& r) { return r.consumer == c; })) Move(req);
    return;
  }
  ProducerNode* p = node.producer;
  for (Req* req : LiveOf(k, [p](const Req& r) { return r.producer == p; })) FallBack(req);
}

void Sim::TransfersLost(ProducerNode* p) {
  std::vector<Req*> running;
  for (const ProducerNode::Pass& pass : p->passes) running.push_back(pass.req);
  std::sort(running.begin(), running.end(), [](Req* a, Req* b) { return a->r.id < b->r.id; });
  for (Req* req : running) FallBack(req);
}

void Sim::Probe(size_t k) {
  probing_[k] = false;
  if (arrivals_done_ && live_.empty()) return;
  coordinator::NodeRegistry& registry = *registries_[k];
  const absl::Time now = clock_.Now();
  for (const coordinator::NodeRegistry::DueProbe& due : registry.TakeDueProbes()) {
    const NodeRef node = NodeNamed(due.node_id);
    // A frozen node answers at its thaw: in time, or the probe's timeout first. A killed one
    // refuses the connection at once.
    const bool down = node.down().Frozen(now);
    const absl::Time answer = down ? now : node.frozen().ThawOf(now);
    const bool ok = !down && answer <= now + coordinator::kProbeTimeout;
    At(ok ? answer : now + coordinator::kProbeTimeout,
       [this, k, id = due.node_id, ok] { registries_[k]->NoteProbe(id, ok); });
  }
  if (registry.NodesOut() == 0) return;
  probing_[k] = true;
  At(now + coordinator::kProbeInterval, [this, k] { Probe(k); });
}

bool Sim::LeaveProducer(Req* req) {
  ProducerNode* p = req->producer;
  if (p == nullptr) return false;
  if (auto q = std::find(p->queue.begin(), p->queue.end(), req); q != p->queue.end()) {
    p->queue.erase(q);
    return true;
  }
  auto pass = std::find_if(p->passes.begin(), p->passes.end(),
                           [req](const ProducerNode::Pass& s) { return s.req == req; });
  if (pass == p->passes.end()) return false;
  Advance(p);
  pass = std::find_if(p->passes.begin(), p->passes.end(),
                      [req](const ProducerNode::Pass& s) { return s.req == req; });
  p->passes.erase(pass);
  Progress(p);  // the others' shares, the queue's next
  return true;
}

void Sim::Move(Req* req) {
  ConsumerNode* from = req->consumer;
  const bool admitted = req->reservation != nullptr;
  LeaveProducer(req);  // its codes are unwanted now (the new replica asks again)
  ++req->epoch;
  if (admitted) {  // the frozen consumer frees it at its thaw
    auto held =
        std::make_shared<std::unique_ptr<Admission::Reservation>>(std::move(req->reservation));
    if (!AtThaw(from->frozen, [held] { held->reset(); })) held->reset();
  }
  SimRequestResult& res = results_[req->r.id];
  if (static_cast<uint32_t>(res.moves) >= coordinator::CoordinatorOptions{}.migration_limit) {
    return Finish(req, absl::StatusCode::kUnavailable);
  }
  req->given_up.insert(from->id);
  const coordinator::Route& last =
      req->moved_routes.empty() ? req->route : req->moved_routes.back();
  const coordinator::MoveConstraint constraint{req->given_up,
                                               last.targets.front().consumer_fingerprint};
  // A stream that began from codes goes on from codes where a producer can send them.
  const TransferMode codes = admitted ? req->mode : TransferMode::kLocal;
  coordinator::NodeRegistry& registry = *registries_[req->coordinator];
  absl::StatusOr<coordinator::Route> route = absl::UnavailableError("not resolved");
  if (codes != TransferMode::kLocal) {
    route = registry.ResolveMove(req->mix->target, constraint, codes);
  }
  if (!route.ok() || route->targets.front().mode == TransferMode::kLocal) {
    route = registry.ResolveMove(req->mix->target, constraint);
  }
  if (!route.ok()) return Finish(req, absl::StatusCode::kUnavailable);
  registry.NoteRouted(*route, nullptr);
  req->moved_routes.push_back(*std::move(route));
  const coordinator::RouteTarget& target = req->moved_routes.back().targets.front();
  req->consumer = consumer_by_id_.at(target.consumer_node);
  req->mode = target.mode;
  req->producer = target.mode == TransferMode::kLocal
                      ? nullptr
                      : producer_by_id_.at(req->moved_routes.back().producer_node);
  req->layers_in = req->layers_taken = 0;
  req->receiving = false;
  ++res.moves;
  res.consumer = req->consumer->id;
  if (req->producer != nullptr) res.producer = req->producer->id;
  Admit(req);
}

void Sim::FallBack(Req* req) {
  if (req->mode == TransferMode::kLocal) return;
  const bool admitted = req->reservation != nullptr;
  // Codes all sent before the producer was lost arrive: nothing to fall back from.
  if (!LeaveProducer(req) && admitted) return;
  ++req->epoch;
  req->mode = TransferMode::kLocal;
  req->fell_back = results_[req->r.id].fell_back = true;
  req->receiving = false;
  if (!admitted) return;  // local once its consumer admits it
  ConsumerNode* c = req->consumer;
  const int64_t cached = Cached(c->cache.get(), *req, TransferModeName(TransferMode::kLocal));
  results_[req->r.id].consumer_cached = cached;
  ConsumerNode::Seq seq;
  seq.req = req;
  seq.epoch = req->epoch;
  seq.prompt_left = req->r.prompt_tokens - cached;
  seq.prompt_done = seq.start = seq.context = cached;
  c->seqs.push_back(seq);
  Kick(c);
}

void Sim::Purge(ConsumerNode* c) {
  c->seqs.erase(std::remove_if(c->seqs.begin(), c->seqs.end(),
                               [](const ConsumerNode::Seq& s) { return Stale(s.req, s.epoch); }),
                c->seqs.end());
  c->work.erase(std::remove_if(c->work.begin(), c->work.end(),
                               [](const ConsumerNode::Work& w) { return Stale(w.req, w.epoch); }),
                c->work.end());
  c->ready.erase(std::remove_if(c->ready.begin(), c->ready.end(),
                                [](const ConsumerNode::Ready& r) { return Stale(r.req, r.epoch); }),
                 c->ready.end());
}

void Sim::Kill(const std::string& node) {
  for (size_t k = 0; k < registries_.size(); ++k) {
    Eject(k, node, "connection reset: its process was killed");
  }
  const NodeRef killed = NodeNamed(node);
  Strand(kAll, killed);
  if (killed.consumer != nullptr) return Wipe(killed.consumer);
  Wipe(killed.producer);
}

void Sim::Wipe(ConsumerNode* c) {
  // Every request it held moved (stale now): their admissions' waits end here, dropped.
  c->admission->Drain();
  c->admission = AdmissionOf(*c->spec, &clock_);
  c->seqs.clear();
  c->work.clear();
  c->ready.clear();
  ++c->life;
  c->stepping = c->kick_at_thaw = false;
  c->idle = true;
  c->pacer = consumer::StepPacer{2.0, 64};
  c->rebuild_itl = {};
  c->price = {};
  c->speeds.emplace();
  c->cache = CacheOf(c->spec->prefix_cache_mb, c->spec->costs.kv_bytes_per_token, &clock_);
}

void Sim::Wipe(ProducerNode* p) {
  Advance(p);
  p->queue.clear();
  p->passes.clear();
  ++p->generation;  // its progress events are stale
  p->link_free = absl::InfinitePast();
  p->speeds.emplace();
  p->cache = CacheOf(p->spec->prefix_cache_mb, p->kv_bytes_per_token, &clock_);
}

void Sim::Lapse(const std::string& node) {
  for (auto& registry : registries_) registry->Deregister(node).IgnoreError();
}

void Sim::Restart(const std::string& node) {
  v1::HeartbeatRequest hb;
  const v1::RegisterRequest* info = nullptr;
  const NodeRef restarted = NodeNamed(node);
  if (ConsumerNode* c = restarted.consumer; c != nullptr) {
    c->idle_since = clock_.Now();
    hb = HeartbeatOf(*c);
    info = &c->info;
  } else {
    ProducerNode* p = restarted.producer;
    p->idle_since = p->updated = clock_.Now();
    hb = HeartbeatOf(*p);
    info = &p->info;
  }
  // A new process registers anew: the old registration (ejected, or lapsed) is gone.
  for (auto& registry : registries_) {
    registry->Deregister(node).IgnoreError();
    registry->Upsert(node, *info, hb).IgnoreError();
  }
}

}  // namespace scd::bench::sim
