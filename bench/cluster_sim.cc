#include "bench/cluster_sim.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <list>
#include <memory>
#include <random>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/prefix_block_cache.h"
#include "base/prefix_hash.h"
#include "base/simulated_clock.h"
#include "base/status_macros.h"
#include "bench/sim_nodes.h"
#include "bench/sim_requests.h"
#include "bench/sim_run.h"
#include "consumer/admission.h"
#include "consumer/step_pacer.h"
#include "consumer/step_plan.h"
#include "coordinator/node_registry.h"
#include "proto/node_speeds.h"
#include "proto/wire_mode.h"

namespace scd::bench::sim {
namespace {

// The daemon's default (consumer/decode_scheduler.h SchedulerOptions::step_log_interval).
constexpr absl::Duration kStepLogInterval = absl::Seconds(10);

std::string ModeName(TransferMode mode) { return TransferModeName(mode); }

}  // namespace

void Sim::AddNodes() {
  for (size_t p = 0; p < d_.producers.size(); ++p) {
    const SimProducerPool& pool = d_.producers[p];
    // The producer's KV per token as its consumers' (the same architecture).
    int64_t kv = 0;
    for (const SimConsumerPool& c : d_.consumers) {
      if (c.producer == pool.name) kv = std::max(kv, c.costs.kv_bytes_per_token);
    }
    for (int64_t i = 0; i < pool.count; ++i) {
      auto node = std::make_unique<ProducerNode>();
      node->id = absl::StrCat(pool.name, "-", i);
      node->pool = p;
      node->spec = &pool;
      node->info = ProducerInfo(pool, node->id);
      node->kv_bytes_per_token = kv;
      node->cache = CacheOf(pool.prefix_cache_mb, kv, &clock_);
      node->use.name = node->id;
      node->use.producer = true;
      node->use.busy_over_time.bin_s = node->use.link_over_time.bin_s =
          SimTimelineBin(w_.duration_s);
      producer_by_id_[node->id] = node.get();
      producers_.push_back(std::move(node));
    }
  }
  for (size_t c = 0; c < d_.consumers.size(); ++c) {
    const SimConsumerPool& pool = d_.consumers[c];
    for (int64_t i = 0; i < pool.count; ++i) {
      auto node = std::make_unique<ConsumerNode>();
      node->id = absl::StrCat(pool.name, "-", i);
      node->pool = c;
      node->spec = &pool;
      node->info = ConsumerInfo(pool, node->id);
      node->admission = AdmissionOf(pool, &clock_);
      node->cache = CacheOf(pool.prefix_cache_mb, pool.costs.kv_bytes_per_token, &clock_);
      node->use.name = node->id;
      node->use.busy_over_time.bin_s = node->use.link_over_time.bin_s =
          SimTimelineBin(w_.duration_s);
      node->step_log.emplace(kStepLogInterval, start_);
      consumer_by_id_[node->id] = node.get();
      consumers_.push_back(std::move(node));
    }
  }
}

// The workload's freezes on their nodes' spans.
absl::Status Sim::AddFaults() {
  for (const SimFault& f : w_.faults) {
    const absl::Time from = start_ + absl::Seconds(f.at_s);
    SCD_ASSIGN_OR_RETURN(const SimNodeRef ref, FindSimNode(d_, f.node));
    const absl::Time to = from + absl::Seconds(SimFaultSpan(d_, ref, f));
    const NodeRef node = NodeNamed(f.node);
    SCD_RETURN_IF_ERROR(
        (f.kind == SimFaultKind::kKill ? node.down() : node.frozen()).Add(from, to));
    ScheduleFailover(f, from, to);
  }
  return absl::OkStatus();
}

Sim::NodeRef Sim::NodeNamed(const std::string& name) const {
  NodeRef n;
  if (auto c = consumer_by_id_.find(name); c != consumer_by_id_.end()) n.consumer = c->second;
  if (auto p = producer_by_id_.find(name); p != producer_by_id_.end()) n.producer = p->second;
  return n;
}

// Every node's state to every coordinator, as its etcd entry would carry it.
void Sim::Heartbeat() {
  const absl::Time now = clock_.Now();
  for (auto& p : producers_) {
    if (p->frozen.Frozen(now) || p->down.Frozen(now)) continue;  // a frozen or killed one: none
    const v1::HeartbeatRequest hb = sim::HeartbeatOf(*p);
    for (auto& r : registries_) r->Upsert(p->id, p->info, hb).IgnoreError();
  }
  for (auto& c : consumers_) {
    if (c->frozen.Frozen(now) || c->down.Frozen(now)) continue;
    const v1::HeartbeatRequest hb = sim::HeartbeatOf(*c);
    for (auto& r : registries_) r->Upsert(c->id, c->info, hb).IgnoreError();
  }
  if (!arrivals_done_ || !live_.empty()) {
    At(clock_.Now() + absl::Milliseconds(d_.heartbeat_ms), [this] { Heartbeat(); });
  }
}

void Sim::Arrive(std::unique_ptr<Req> owned) {
  Req* req = owned.get();
  live_[req->r.id] = std::move(owned);
  req->arrival = clock_.Now();
  req->mix = &w_.mix[req->r.mix];
  req->coordinator = static_cast<size_t>(req->r.id % registries_.size());
  SimRequestResult& res = results_[req->r.id];
  res.id = req->r.id;
  res.arrival_s = req->r.arrival_s;
  res.prompt_tokens = req->r.prompt_tokens;
  res.output_tokens = req->r.output_tokens;
  res.mix = req->r.mix;
  req->hint.blocks = req->r.blocks;
  req->hint.block_tokens = kBlock;
  req->hint.kv_positions = req->r.prompt_tokens + req->r.output_tokens;
  req->hint.prompt_tokens = req->r.prompt_tokens;
  coordinator::NodeRegistry& registry = *registries_[req->coordinator];
  absl::StatusOr<coordinator::Route> route =
      registry.Resolve({req->mix->target}, req->mix->mode, &req->hint, 0, w_.objective_ttft_ms,
                       /*local_fallback=*/true);  // the clients' requests allow it (unset)
  if (!route.ok()) return Finish(req, route.status().code());
  req->route = *std::move(route);
  registry.NoteRouted(req->route, &req->hint);
  const coordinator::RouteTarget& target = req->route.targets[0];
  req->consumer = consumer_by_id_.at(target.consumer_node);
  const NodeProfile& costs = req->consumer->spec->costs;
  req->api_us = costs.api_overhead_us;
  if (req->consumer->idle) {
    // The hop to a consumer with nothing to do: the share of the idle one the idle gives.
    req->api_us += costs.idle.Share(IdleUs(req->consumer->idle_since)) *
                   std::max(0.0, costs.idle.api_overhead_us - costs.api_overhead_us);
  }
  res.mode = req->mode = target.mode;
  res.consumer = req->consumer->id;
  if (target.mode != TransferMode::kLocal) {
    req->producer = producer_by_id_.at(req->route.producer_node);
    res.producer = req->producer->id;
  }
  Admit(req);
}

void Sim::Admit(Req* req) {
  auto admit = [this, req, epoch = req->epoch] {
    if (Stale(req, epoch)) return;  // it moved while its consumer was frozen
    const int64_t bytes = req->hint.kv_positions * req->consumer->spec->costs.kv_bytes_per_token;
    req->consumer->admission->AdmitAsync(bytes, absl::InfiniteFuture(), nullptr,
                                         [this, req, epoch](Admission::Admitted admitted) {
                                           Admitted(req, epoch, std::move(admitted));
                                         });
  };
  if (!AtThaw(req->consumer->frozen, admit)) admit();  // a frozen consumer: at its thaw
}

void Sim::Admitted(Req* req, uint64_t epoch, Admission::Admitted admitted) {
  if (Stale(req, epoch)) return;  // it left this consumer: what it was given goes back now
  if (ending_) {
    // The run is over: a request still waiting (its wait ended by the drain) or one a release at
    // the end admitted ran past the time allowed.
    return Finish(req, absl::StatusCode::kDeadlineExceeded);
  }
  if (!admitted.ok()) return Finish(req, admitted.status().code());
  req->reservation = *std::move(admitted);
  ConsumerNode* c = req->consumer;
  const int64_t cached = Cached(c->cache.get(), *req, ModeName(req->mode));
  results_[req->r.id].consumer_cached = cached;
  if (req->mode == TransferMode::kLocal) {
    ConsumerNode::Seq seq;
    seq.req = req;
    seq.epoch = req->epoch;
    seq.prompt_left = req->r.prompt_tokens + req->tokens - cached;  // a moved stream's tokens too
    seq.prompt_done = seq.start = seq.context = cached;
    c->seqs.push_back(seq);
    return Kick(c);
  }
  req->sent = req->r.prompt_tokens - 1 - cached;
  ProducerNode* p = req->producer;
  Advance(p);
  p->queue.push_back(req);
  Progress(p);
}

// The passes' progress since `p->updated`: the node's compute shared equally among them.
void Sim::Advance(ProducerNode* p) {
  const absl::Time now = clock_.Now();
  const double us = absl::ToDoubleMicroseconds(p->frozen.Active(p->updated, now));
  const absl::Time from = p->updated;
  p->updated = now;
  if (p->passes.empty() || us <= 0) return;
  p->use.busy_s += us / 1e6;
  p->use.busy_over_time.Add(absl::ToDoubleSeconds(from - start_), us / 1e6);
  const double each = us / static_cast<double>(p->passes.size());
  for (ProducerNode::Pass& pass : p->passes) pass.done_us += each;
}

// Passes started from the queue while fewer than the pool's prefill threads run. A pass started
// on a node with none running pays the profile's idle slowdown.
void Sim::StartPasses(ProducerNode* p) {
  while (!p->queue.empty() && static_cast<int64_t>(p->passes.size()) < p->spec->prefill_threads) {
    Req* req = p->queue.front();
    p->queue.pop_front();
    const double slowdown = p->passes.empty() ? IdleFactor(p->spec->costs.idle, p->idle_since) : 1;
    const int64_t cached = Cached(p->cache.get(), *req, "");
    results_[req->r.id].producer_cached = cached;
    ProducerNode::Pass pass;
    pass.req = req;
    pass.tokens = req->r.prompt_tokens - 1 - cached;
    pass.work_us = pass.tokens > 0 ? p->spec->costs.prefill.At(pass.tokens, cached) * slowdown : 0;
    pass.start = clock_.Now();
    p->passes.push_back(pass);
  }
}

// A layer's codes leave as the pass has them, in order on the producer's link.
void Sim::SendLayer(ProducerNode* p, Req* req, int64_t layer) {
  const SimConsumerPool& pool = *req->consumer->spec;
  const bool raw = req->mode == TransferMode::kRaw;
  const double per_token = raw ? pool.costs.kv_bytes_per_token / 2.0 : pool.code_bytes_per_token;
  const double layer_bytes = static_cast<double>(req->sent) * per_token / pool.layers;
  const SimLink link = d_.LinkOf(p->pool, req->consumer->pool);
  const absl::Time send = std::max(clock_.Now(), p->link_free);
  const double seconds =
      link.steps != nullptr
          ? TraceSendSeconds(*link.steps, absl::ToDoubleSeconds(send - start_), layer_bytes)
          : layer_bytes / (link.gbps * 1e9 / 8);
  p->link_free = send + absl::Seconds(seconds);
  p->use.link_s += seconds;
  p->use.link_over_time.Add(absl::ToDoubleSeconds(send - start_), seconds);
  if (layer == 0) req->first_byte = send;
  At(p->link_free + absl::Microseconds(link.latency_us),
     [this, req, epoch = req->epoch] { LayerArrived(req, epoch); });
}

// The producer's passes brought to now: layers they finished sent, passes done ended, the queue's
// next started, and the next event set at the first layer a pass will finish at the shares then.
void Sim::Progress(ProducerNode* p) {
  // The shares' rounding: a nanosecond, past the clock's resolution (a quarter of one), so that a
  // layer this close is sent now and the next event is at least that far ahead.
  constexpr double kEpsilonUs = 1e-3;
  Advance(p);
  if (p->frozen.Frozen(clock_.Now())) {  // nothing moves until the thaw
    AtThaw(p->frozen, [this, p, generation = ++p->generation] {
      if (generation == p->generation) Progress(p);
    });
    return;
  }
  for (ProducerNode::Pass& pass : p->passes) {
    const int64_t layers = pass.req->consumer->spec->layers;
    while (pass.layers_out < layers &&
           pass.done_us + kEpsilonUs >=
               pass.work_us * static_cast<double>(pass.layers_out + 1) / layers) {
      SendLayer(p, pass.req, pass.layers_out++);
    }
  }
  for (auto it = p->passes.begin(); it != p->passes.end();) {
    if (it->layers_out < it->req->consumer->spec->layers) {
      ++it;
      continue;
    }
    Req* req = it->req;
    // The pass's wall time, as the daemon's tracker and log see it.
    req->prefill_us = absl::ToDoubleMicroseconds(clock_.Now() - it->start);
    if (it->tokens > 0) p->speeds->ObservePrefill(it->tokens, req->prefill_us);
    Keep(p->cache.get(), *req, "", req->consumer->spec->costs.kv_bytes_per_token);
    ++p->use.served;
    it = p->passes.erase(it);
  }
  StartPasses(p);
  if (p->passes.empty()) {
    p->idle_since = clock_.Now();
    return;
  }
  double next_us = std::numeric_limits<double>::infinity();
  for (const ProducerNode::Pass& pass : p->passes) {
    const int64_t layers = pass.req->consumer->spec->layers;
    const double at = pass.work_us * static_cast<double>(pass.layers_out + 1) / layers;
    next_us = std::min(next_us, std::max(0.0, at - pass.done_us));
  }
  const uint64_t generation = ++p->generation;
  At(p->frozen.EndOf(clock_.Now(),
                     absl::Microseconds(next_us * static_cast<double>(p->passes.size()))),
     [this, p, generation] {
       if (generation == p->generation) Progress(p);
     });
}

void Sim::LayerArrived(Req* req, uint64_t epoch) {
  if (Stale(req, epoch)) return;  // codes for a request that left its producer or consumer
  ConsumerNode* c = req->consumer;
  if (AtThaw(c->frozen, [this, req, epoch] { LayerArrived(req, epoch); })) return;  // at the thaw
  ++req->layers_in;
  TakeLayer(req);
  Kick(c);
}

// The receive takes the next layer that arrived once the one before ran through its tail (the
// daemon's CodeReceiver takes its next chunk after the rebuild its last one set off): its rows
// into the consumer's queue. The transfer, as the daemon reports it, ends when the last is taken.
void Sim::TakeLayer(Req* req) {
  if (req->receiving || req->layers_taken >= req->layers_in) return;
  req->receiving = true;
  ConsumerNode* c = req->consumer;
  if (req->layers_taken + 1 == c->spec->layers) {
    req->transfer_us = absl::ToDoubleMicroseconds(clock_.Now() - req->first_byte);
  }
  ConsumerNode::Work w;
  w.req = req;
  w.epoch = req->epoch;
  w.rows = w.rows_left = std::max<int64_t>(req->sent, 1);
  w.raw = req->mode == TransferMode::kRaw;
  c->work.push_back(w);
}

// A work item's rows all ran: a layer's tail next, after a tail the next layer (or, after the
// last, the last logits), after the last logits the first decode.
void Sim::WorkDone(ConsumerNode* c, const ConsumerNode::Work& w) {
  Req* req = w.req;
  ConsumerNode::Work next;
  next.req = req;
  next.epoch = w.epoch;
  next.rows = next.rows_left = 1;
  switch (w.kind) {
    case ConsumerNode::Kind::kLayer:
      next.kind = ConsumerNode::Kind::kTail;
      c->work.push_back(next);
      return;
    case ConsumerNode::Kind::kTail:
      req->receiving = false;
      if (++req->layers_taken < c->spec->layers) return TakeLayer(req);
      next.kind = ConsumerNode::Kind::kLogits;
      c->work.push_back(next);
      return;
    case ConsumerNode::Kind::kLogits:
      c->ready.push_back({req, w.epoch});
      return;
  }
}

void Sim::Kick(ConsumerNode* c) {
  if (c->stepping) return;
  Purge(c);
  if (c->frozen.Frozen(clock_.Now())) {  // one step planned at the thaw
    if (!c->kick_at_thaw) {
      c->kick_at_thaw = AtThaw(c->frozen, [this, c] {
        c->kick_at_thaw = false;
        Kick(c);
      });
    }
    return;
  }
  consumer::StepState state;
  state.now = clock_.Now();
  for (const ConsumerNode::Seq& s : c->seqs) {
    consumer::PlannedSequence planned;
    planned.decoding = s.decoding;
    planned.prompt_left = s.prompt_left;
    state.sequences.push_back(planned);
  }
  for (const ConsumerNode::Work& w : c->work) state.work.push_back({w.rows_left, w.layers()});
  const NodeProfile& k = c->spec->costs;
  state.rebuild_row_layer_s = c->price.RowLayerSeconds();
  consumer::StepLimits limits;
  limits.max_batched_tokens = k.step_rows;
  limits.model_layers = c->spec->layers;
  consumer::StepPlan plan = consumer::PlanStep(state, c->pacer, limits);
  if (plan.batch.empty() && plan.pieces.empty() && c->ready.empty()) {
    if (!c->idle) c->idle_since = clock_.Now();
    c->idle = true;
    return;
  }
  std::vector<ConsumerNode::Ready> ready;
  ready.swap(c->ready);
  double seconds = StepSeconds(c, plan, ready);
  if (c->idle) seconds *= IdleFactor(k.idle, c->idle_since);
  c->idle = false;
  c->stepping = true;
  // A freeze during the step: it ends as much later, and the daemon's account sees that long.
  const absl::Time end = c->frozen.EndOf(clock_.Now(), absl::Seconds(seconds));
  const double elapsed = absl::ToDoubleSeconds(end - clock_.Now());
  At(end, [this, c, life = c->life, plan = std::move(plan), ready = std::move(ready), seconds,
           elapsed]() mutable {
    if (life == c->life) StepDone(c, plan, std::move(ready), seconds, elapsed);  // else killed
  });
}

// Microseconds since `since` (InfinitePast: since the run began).
double Sim::IdleUs(absl::Time since) const {
  return absl::ToDoubleMicroseconds(clock_.Now() - std::max(since, start_));
}

// The slowdown of work starting now on a node idle since `since`: a draw only where the profile
// measured one, so that a profile without it leaves every run as it was.
double Sim::IdleFactor(const IdleCost& idle, absl::Time since) {
  const double idle_us = IdleUs(since);
  if (idle.Share(idle_us) <= 0) return 1;
  return idle.Factor(idle_us, std::normal_distribution<double>()(rng_));
}

// The step's time by the profile: its decodes, its prompt chunks (each token against the context
// before it; a prompt's fixed cost with its first chunk), its rebuild pieces (a row is one
// layer's share of a token) and the first decodes of caches completed.
double Sim::StepSeconds(ConsumerNode* c, const consumer::StepPlan& plan,
                        const std::vector<ConsumerNode::Ready>& ready) {
  const NodeProfile& k = c->spec->costs;
  double forward_us = 0, context = 0;
  for (const consumer::StepPlan::Member& m : plan.batch) {
    const ConsumerNode::Seq& s = c->seqs[m.sequence];
    if (m.chunk == 0) {
      context += static_cast<double>(s.context);
      continue;
    }
    const double n = static_cast<double>(m.chunk), done = static_cast<double>(s.prompt_done);
    forward_us +=
        k.prefill.per_token_us * n + k.prefill.per_token_context_us * (n * done + n * (n + 1) / 2);
    if (s.prompt_done == s.start) forward_us += k.prefill.fixed_us;
  }
  if (plan.decodes > 0) forward_us += k.decode_step.At(plan.decodes, static_cast<int64_t>(context));
  // The step as the real one runs it: over or under its cost by the measured spread, which the
  // pacer sees and trims its chunks for, and the pieces' price learns, as the real ones do.
  const double noise = k.step_noise.measured()
                           ? k.step_noise.Factor(std::uniform_real_distribution<double>()(rng_))
                           : 1.0;
  forward_us *= noise;
  double pieces_us = 0;
  for (const consumer::StepPlan::Piece& piece : plan.pieces) {
    const ConsumerNode::Work& w = c->work[piece.work];
    const double us = PieceUs(k, c->spec->layers, w, piece.rows) * noise;
    pieces_us += us;
    if (w.kind == ConsumerNode::Kind::kLayer && !w.raw) w.req->rebuild_us += us;
    // As the daemon's scheduler (DecodeScheduler::RunPieces): its price, and what a piece beside
    // decodes costs them.
    c->price.Observe(us / 1e6, piece.rows, w.layers());
    if (plan.decodes > 0 && w.layers() > 0) {
      c->rebuild_itl.Add(us / 1e6, static_cast<double>(piece.rows * w.layers()) /
                                       static_cast<double>(c->spec->layers));
    }
  }
  double first_us = 0;
  for (const ConsumerNode::Ready& r : ready) {
    first_us += k.first_decode.At(static_cast<double>(r.req->r.prompt_tokens));
  }
  first_us *= noise;
  // As the daemon's scheduler: the time it had for chunks after the pieces' estimates.
  c->pacer.Observe(plan.decodes, plan.prefill_tokens, forward_us / 1e6, plan.chunk_allowed);
  c->pieces_s = pieces_us / 1e6;
  return (forward_us + pieces_us + first_us) / 1e6;
}

// The step into its consumer's step log, as the daemon's scheduler adds it; a line due is kept
// with the simulated time it was written at.
void Sim::Account(ConsumerNode* c, const consumer::StepPlan& plan, double seconds) {
  consumer::StepRecord step;
  step.seconds = seconds;
  step.decodes = plan.decodes;
  step.prompt_tokens = plan.prefill_tokens;
  for (const consumer::StepPlan::Piece& piece : plan.pieces) step.rebuild_rows += piece.rows;
  step.pieces = static_cast<int64_t>(plan.pieces.size());
  step.pieces_seconds = c->pieces_s;
  step.measuring = plan.decodes_only;
  c->step_log->Add(step);
  const absl::Time now = clock_.Now();
  const std::optional<std::string> line =
      c->step_log->Line(now, c->pacer.aim(), static_cast<int64_t>(c->seqs.size()));
  if (line.has_value()) {
    c->use.step_log.push_back(absl::StrCat("t=", absl::ToDoubleSeconds(now - start_), " ", *line));
  }
}

void Sim::StepDone(ConsumerNode* c, const consumer::StepPlan& plan,
                   std::vector<ConsumerNode::Ready> ready, double seconds, double elapsed) {
  c->stepping = false;
  c->use.busy_s += seconds;
  c->use.busy_over_time.Add(absl::ToDoubleSeconds(clock_.Now() - start_) - seconds, seconds);
  ++c->use.steps;
  Account(c, plan, elapsed);
  for (const consumer::StepPlan::Piece& piece : plan.pieces) {
    c->work[piece.work].rows_left -= piece.rows;
  }
  // Work done, or of a request that left while the step ran (dropped).
  while (!c->work.empty() &&
         (c->work.front().rows_left <= 0 || Stale(c->work.front().req, c->work.front().epoch))) {
    const ConsumerNode::Work w = c->work.front();
    c->work.pop_front();
    if (!Stale(w.req, w.epoch)) WorkDone(c, w);
  }
  std::vector<Req*> done;
  for (const consumer::StepPlan::Member& m : plan.batch) {
    ConsumerNode::Seq& s = c->seqs[m.sequence];
    if (Stale(s.req, s.epoch)) continue;
    s.context += m.chunk == 0 ? 1 : m.chunk;
    if (m.chunk == 0) {
      if (++s.req->tokens >= s.req->r.output_tokens) done.push_back(s.req);
      continue;
    }
    s.prompt_left -= m.chunk;
    s.prompt_done += m.chunk;
    if (s.prompt_left > 0) continue;
    s.decoding = true;
    PrefillDone(s.req);
    if (s.req->tokens >= s.req->r.output_tokens) done.push_back(s.req);
  }
  for (const ConsumerNode::Ready& r : ready) {
    if (Stale(r.req, r.epoch)) continue;
    Req* req = r.req;
    req->first_decode_us =
        c->spec->costs.first_decode.At(static_cast<double>(req->r.prompt_tokens));
    ConsumerNode::Seq seq;
    seq.req = req;
    seq.epoch = req->epoch;
    seq.context = seq.prompt_done = seq.start = req->r.prompt_tokens;
    if (req->tokens > 0) {
      seq.prompt_left = req->tokens;  // a moved stream: its tokens prefilled on the codes' cache
    } else {
      PrefillDone(req);
      seq.decoding = true;
      if (req->tokens >= req->r.output_tokens) done.push_back(req);
    }
    c->seqs.push_back(seq);
  }
  c->seqs.erase(std::remove_if(c->seqs.begin(), c->seqs.end(),
                               [&done](const ConsumerNode::Seq& s) {
                                 return Stale(s.req, s.epoch) ||
                                        std::find(done.begin(), done.end(), s.req) != done.end();
                               }),
                c->seqs.end());
  for (Req* req : done) Finish(req, absl::StatusCode::kOk);
  Kick(c);
}

void Sim::PrefillDone(Req* req) {
  if (req->first_token == absl::InfinitePast()) {
    req->first_token = clock_.Now();
    req->tokens = 1;
  } else {
    ++req->tokens;  // a moved stream's next token
  }
  const coordinator::Route& route =
      req->moved_routes.empty() ? req->route : req->moved_routes.back();
  registries_[req->coordinator]->NoteFirstToken(route, 0);
  ConsumerNode* c = req->consumer;
  Keep(c->cache.get(), *req, ModeName(req->mode), c->spec->costs.kv_bytes_per_token);
}

void Sim::Finish(Req* req, absl::StatusCode code) {
  std::unique_ptr<Req> owned = std::move(live_.at(req->r.id));
  live_.erase(req->r.id);
  SimRequestResult& res = results_[req->r.id];
  res.code = code;
  if (!req->route.targets.empty()) {
    coordinator::NodeRegistry& registry = *registries_[req->coordinator];
    registry.RoutedDone(req->route);
    for (const coordinator::Route& moved : req->moved_routes) registry.RoutedDone(moved);
    if (code == absl::StatusCode::kOk) {
      const double api_s = 1e-6 * req->api_us;
      res.ttft_s = api_s + absl::ToDoubleSeconds(req->first_token - req->arrival);
      res.e2el_s = api_s + absl::ToDoubleSeconds(clock_.Now() - req->arrival);
      const v1::Finished finished = FinishedOf(*req, res, clock_.Now());
      const coordinator::Route& route =
          req->moved_routes.empty() ? req->route : req->moved_routes.back();
      registry.ObserveFinished(route, route.targets[0], finished);
      req->consumer->speeds->ObserveFinished(finished);
      ++req->consumer->use.served;
    }
  }
  owned->reservation.reset();  // may admit a waiting request here
  // A request that left a node may still be named by what that node holds (stale, bench/sim_run.h).
  if (owned->epoch > 0) left_nodes_.push_back(std::move(owned));
}

absl::StatusOr<ClusterSimResult> Sim::Run(double drain_s) {
  const absl::Time wall = absl::Now();
  start_ = clock_.Now();
  coordinator::RegistryOptions options;
  options.lease = absl::Seconds(d_.lease_s);
  options.heartbeat_interval = absl::Milliseconds(d_.heartbeat_ms);
  for (int64_t i = 0; i < d_.coordinators; ++i) {
    registries_.push_back(std::make_unique<coordinator::NodeRegistry>(options, &clock_));
  }
  probing_.assign(registries_.size(), false);
  AddNodes();
  SCD_RETURN_IF_ERROR(AddFaults());
  Heartbeat();
  std::function<void()> next_arrival = [this, &next_arrival] {
    SimRequest r;
    if (!requests_.Next(&r)) {
      arrivals_done_ = true;
      return;
    }
    results_.emplace_back();
    At(start_ + absl::Seconds(r.arrival_s), [this, r, &next_arrival]() {
      auto req = std::make_unique<Req>();
      req->r = r;
      Arrive(std::move(req));
      next_arrival();
    });
  };
  next_arrival();
  const absl::Time limit = start_ + absl::Seconds(w_.duration_s + drain_s);
  absl::Time last = start_;
  while (clock_.next() <= limit && !(arrivals_done_ && live_.empty())) {
    last = clock_.next();
    clock_.AdvanceTo(last);
  }
  // What still runs ran past the drain: the requests waiting for admission first (each
  // admission's drain ends their waits, so no release below admits one already ended), then the
  // rest in arrival order.
  ending_ = true;
  for (auto& c : consumers_) c->admission->Drain();
  std::vector<Req*> left;
  for (auto& [id, req] : live_) left.push_back(req.get());
  std::sort(left.begin(), left.end(), [](Req* a, Req* b) { return a->r.id < b->r.id; });
  for (Req* req : left) Finish(req, absl::StatusCode::kDeadlineExceeded);
  ClusterSimResult out;
  out.requests = std::move(results_);
  for (auto& p : producers_) out.nodes.push_back(p->use);
  for (auto& c : consumers_) out.nodes.push_back(c->use);
  out.simulated_s = absl::ToDoubleSeconds(last - start_);
  out.wall_s = absl::ToDoubleSeconds(absl::Now() - wall);
  out.events = events_;
  return out;
}

}  // namespace scd::bench::sim

namespace scd::bench {

absl::StatusOr<ClusterSimResult> RunClusterSim(const SimDeployment& deployment,
                                               const SimWorkload& workload, double drain_s) {
  SCD_RETURN_IF_ERROR(CheckSimWorkload(workload, deployment));
  sim::Sim sim(deployment, workload);
  return sim.Run(drain_s);
}

}  // namespace scd::bench
