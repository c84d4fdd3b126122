#include "bench/soak_faults.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/bandwidth_sweep.h"
#include "proto/inference_client.h"
#include "proto/registry_client.h"
#include "proto/wire_mode.h"

namespace scd::bench {
namespace {

constexpr double kTrickleGbps = 0.00005;  // 6.25 kB/s: a raw prompt's KV takes seconds
// How long a consumer's, coordinator's or the producer's fault first waits for two streams there
// (more to move or resume per fault), then for one. A fables stream lasts 38 ms at the median
// (0.8 s at p90) and one is under way 56 % of the time, yet with 2 s for one, 8 of 24 replica
// freezes of a 30-minute run found none and moved nothing: it waits 6 s for one.
constexpr absl::Duration kTwoStreamsWait = absl::Seconds(2);
constexpr absl::Duration kOneStreamWait = absl::Seconds(6);

// Polls `ready` every 100 ms until it holds or `max_wait` passes: when it held.
absl::Time WaitFor(const std::function<bool()>& ready, absl::Duration max_wait) {
  const absl::Time limit = absl::Now() + max_wait;
  for (;;) {
    if (ready()) return absl::Now();
    if (absl::Now() > limit) return absl::InfinitePast();
    absl::SleepFor(absl::Milliseconds(100));
  }
}

int FirstOf(const std::vector<SoakNode>& nodes, SoakRole role) {
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i].role == role) return static_cast<int>(i);
  }
  return -1;
}

// Every live coordinator serves every target in `mode` (raw needs the producer too).
bool ServedThroughEveryCoordinator(const SoakDeployment& d, const std::vector<std::string>& targets,
                                   const std::string& mode) {
  const std::vector<std::string> coordinators = d.LiveCoordinators();
  if (coordinators.empty()) return false;
  for (const std::string& c : coordinators) {
    for (const std::string& t : targets) {
      if (!Probe(c, t, mode)) return false;
    }
  }
  return true;
}

// What "serving again" means after a fault on `node` (or the link, node < 0).
bool Serving(const SoakDeployment& d, int node, const std::vector<std::string>& targets) {
  if (node < 0) return ServedThroughEveryCoordinator(d, targets, "raw");
  const SoakNode n = d.Node(node);
  switch (n.role) {
    case SoakRole::kConsumer:
      return d.RoutedEverywhere(n, true) && Probe(n.address, n.model, "local") &&
             ServedThroughEveryCoordinator(d, {n.model}, "local");
    case SoakRole::kProducer:
      return d.RoutedEverywhere(n, true) && ServedThroughEveryCoordinator(d, targets, "raw");
    case SoakRole::kCoordinator:
      for (const std::string& t : targets) {
        if (!Probe(n.address, t, "raw")) return false;
      }
      return true;
    case SoakRole::kEtcd:
      for (const SoakNode& other : d.Snapshot()) {
        const bool routed = other.role == SoakRole::kConsumer || other.role == SoakRole::kProducer;
        if (routed && !d.RoutedEverywhere(other, true)) return false;
      }
      return ServedThroughEveryCoordinator(d, targets, "raw");
  }
  return false;
}

// Whether node `i` holds `n` streams now: a consumer decoding sequences, a coordinator routing
// requests, the producer prefilling or sending codes (its death makes their consumers fall back).
bool HoldsStreams(const SoakDeployment& d, int i, uint32_t n) {
  if (d.Node(i).role == SoakRole::kCoordinator) {
    const absl::StatusOr<v1::HealthResponse> health = d.Health(i);
    return health.ok() && health->active_requests() >= n;
  }
  const absl::StatusOr<v1::NodeStats> stats = d.Stats(i);
  if (!stats.ok()) return false;
  if (d.Node(i).role == SoakRole::kProducer) return stats->running() + stats->open_sessions() >= n;
  return stats->sequences() >= n;
}

// The first of `nodes` that holds two streams within kTwoStreamsWait, else one within
// kOneStreamWait; -1 when none did.
int StreamHolder(const SoakDeployment& d, const std::vector<int>& nodes) {
  int holder = -1;
  for (const auto& [n, wait] : {std::pair{2u, kTwoStreamsWait}, std::pair{1u, kOneStreamWait}}) {
    const absl::Time found = WaitFor(
        [&] {
          for (int i : nodes) {
            if (HoldsStreams(d, i, n)) {
              holder = i;
              return true;
            }
          }
          return false;
        },
        wait);
    if (found != absl::InfinitePast()) return holder;
  }
  return -1;
}

}  // namespace

const char* FaultKindName(FaultKind kind) {
  switch (kind) {
    case FaultKind::kKill:
      return "kill";
    case FaultKind::kFreeze:
      return "freeze";
    case FaultKind::kFlap:
      return "flap";
    case FaultKind::kEtcd:
      return "etcd";
    case FaultKind::kReplace:
      return "replace";
    case FaultKind::kLinkDown:
      return "link-down";
  }
  return "?";
}

bool FaultOutcome::ok() const {
  return error.empty() && recovered != absl::InfinitePast() && recovery_s <= recovery_bound_s &&
         (out_of_routing_s < 0 || out_of_routing_s <= out_of_routing_bound_s);
}

namespace {

// `fault` with the nodes it may go to instead: a replicated consumer's replicas, the
// coordinators (each list holding `fault.node`).
SoakFault Either(const std::vector<SoakNode>& nodes, const std::vector<int>& replicated,
                 const std::vector<int>& coordinators, SoakFault fault) {
  if (fault.kind != FaultKind::kKill && fault.kind != FaultKind::kFreeze) return fault;
  const SoakNode& n = nodes[static_cast<size_t>(fault.node)];
  if (n.role == SoakRole::kCoordinator) fault.either = coordinators;
  if (std::find(replicated.begin(), replicated.end(), fault.node) != replicated.end()) {
    for (int r : replicated) {
      if (nodes[static_cast<size_t>(r)].model == n.model) fault.either.push_back(r);
    }
  }
  return fault;
}

// Cycle `cycle` (> 0)'s faults, in `*faults`.
void LaterFaults(int cycle, const std::vector<int>& killable, const std::vector<int>& replicated,
                 const std::vector<int>& coordinators, int producer, int etcd, absl::Duration hold,
                 std::vector<SoakFault>* faults) {
  // Later cycles: one node killed and another frozen, in turn, so that every process also lives
  // long enough for its memory's growth to be measured; a coordinator replaced every third. And
  // twice a cycle a replica of a replicated target frozen past the keepalive bound: its streams
  // must move to the other replica (frozen, not killed: its memory's growth is still measured);
  // the two apart, so that streams gather again in between. And the producer frozen past the
  // keepalive bound mid-transfer every cycle: its transfers' consumers fall back to local prefill
  // (the turn alone reaches it once in three cycles, too few fallbacks; frozen, not killed, so
  // that it lives long enough for its memory's growth to be measured).
  const size_t c = static_cast<size_t>(cycle);
  *faults = {
      {FaultKind::kKill, killable[(c - 1) % killable.size()], hold, {}},
      {FaultKind::kFlap, -1, hold, {}},
      {FaultKind::kFreeze, producer, hold, {}},
      {FaultKind::kFreeze, killable[(c + 2) % killable.size()], hold, {}},
      {FaultKind::kEtcd, etcd, hold, {}},
  };
  if (!replicated.empty()) {
    faults->insert(faults->begin() + 1,
                   {FaultKind::kFreeze, replicated[(c + 1) % replicated.size()], hold, {}});
    faults->push_back({FaultKind::kFreeze, replicated[c % replicated.size()], hold, {}});
  }
  if (c % 3 == 0) {
    faults->push_back({FaultKind::kReplace, coordinators[(c / 3) % coordinators.size()], hold, {}});
  }
  // A coordinator killed mid-stream every third cycle besides its turn: its streams' clients
  // resume through another (the turn alone kills one every sixth cycle, too few resumes).
  if (c % 3 == 1) {
    faults->push_back({FaultKind::kKill, coordinators[(c / 3) % coordinators.size()], hold, {}});
  }
}

}  // namespace

std::vector<SoakFault> SoakFaultCycle(const std::vector<SoakNode>& nodes, int cycle,
                                      bool link_down) {
  std::vector<int> consumers, coordinators, killable, replicated;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const int n = static_cast<int>(i);
    if (nodes[i].role == SoakRole::kConsumer) consumers.push_back(n);
    if (nodes[i].role == SoakRole::kConsumer &&
        std::count_if(nodes.begin(), nodes.end(), [&](const SoakNode& other) {
          return other.role == SoakRole::kConsumer && other.model == nodes[i].model;
        }) > 1) {
      replicated.push_back(n);
    }
    if (nodes[i].role == SoakRole::kCoordinator) coordinators.push_back(n);
    if (nodes[i].role != SoakRole::kEtcd) killable.push_back(n);
  }
  const int producer = FirstOf(nodes, SoakRole::kProducer);
  const int etcd = FirstOf(nodes, SoakRole::kEtcd);
  const absl::Duration hold = absl::Seconds(3);
  std::vector<SoakFault> faults;
  if (cycle == 0) {  // every kind, every role killed and frozen once
    faults = {
        {FaultKind::kKill, consumers[0], hold, {}},
        {FaultKind::kFreeze, consumers[1 % consumers.size()], hold, {}},
        {FaultKind::kFlap, -1, hold, {}},
        {FaultKind::kKill, producer, hold, {}},
        {FaultKind::kFreeze, coordinators[0], hold, {}},
        {FaultKind::kEtcd, etcd, hold, {}},
        {FaultKind::kReplace, coordinators[0], hold, {}},
        {FaultKind::kFreeze, producer, hold, {}},
        {FaultKind::kKill, coordinators[1 % coordinators.size()], hold, {}},
    };
  } else {
    LaterFaults(cycle, killable, replicated, coordinators, producer, etcd, hold, &faults);
  }
  // The producer's link cut and restored after the flap (its transfers' consumers fall back).
  if (link_down) {
    const auto flap = std::find_if(faults.begin(), faults.end(),
                                   [](const SoakFault& f) { return f.kind == FaultKind::kFlap; }) -
                      faults.begin();
    faults.insert(faults.begin() + flap + 1, {FaultKind::kLinkDown, producer, hold, {}});
    // The cut and its recovery lengthen every cycle (30 minutes hold 8 cycles instead of 9, 16
    // replica freezes that moved 15 streams): a later cycle freezes a replica a third time, right
    // after the cut, apart from the other two and from the turn's freeze.
    if (cycle > 0 && !replicated.empty()) {
      const size_t c = static_cast<size_t>(cycle);
      faults.insert(faults.begin() + flap + 2,
                    {FaultKind::kFreeze, replicated[(c + 2) % replicated.size()], hold, {}});
    }
  }
  for (SoakFault& f : faults) f = Either(nodes, replicated, coordinators, std::move(f));
  return faults;
}

FaultOutcome RunSoakFault(SoakDeployment& d, const SoakFault& planned,
                          const std::vector<std::string>& targets, absl::Duration max_wait) {
  FaultOutcome out;
  SoakFault fault = planned;
  // A consumer, a coordinator or the producer is killed or frozen (or the producer's link cut)
  // mid-stream (its streams must move, resume or fall back), so the fault waits a while for one
  // to be under way there (or on a node of `either`, which it then goes to).
  const SoakRole role = fault.node >= 0 ? d.Node(fault.node).role : SoakRole::kEtcd;
  if ((fault.kind == FaultKind::kKill || fault.kind == FaultKind::kFreeze ||
       fault.kind == FaultKind::kLinkDown) &&
      role != SoakRole::kEtcd) {
    const int holder =
        StreamHolder(d, fault.either.empty() ? std::vector<int>{fault.node} : fault.either);
    out.mid_stream = holder >= 0;
    if (holder >= 0) fault.node = holder;
  }
  out.fault = fault;
  if (fault.node >= 0) {
    const SoakNode n = d.Node(fault.node);
    out.node = n.name;
    out.role = n.role;
    out.model = n.model;
    out.address = n.address;
  }
  out.start = absl::Now();
  absl::StatusOr<absl::Time> ready = absl::Now();
  switch (fault.kind) {
    case FaultKind::kKill: {
      d.Kill(fault.node);
      const SoakNode gone = d.Node(fault.node);
      if (out.role == SoakRole::kConsumer || out.role == SoakRole::kProducer) {
        SoakNode as_was = gone;
        as_was.address = out.address;
        out.out_of_routing_bound_s = absl::ToDoubleSeconds(kEtcdLeaseTtl + absl::Seconds(3));
        const absl::Time left =
            WaitFor([&] { return d.RoutedEverywhere(as_was, false); }, max_wait);
        if (left != absl::InfinitePast()) {
          out.out_of_routing_s = absl::ToDoubleSeconds(left - out.start);
        } else {
          out.error = "still routed to after " + absl::FormatDuration(max_wait);
        }
      } else {
        absl::SleepFor(fault.hold);
      }
      ready = d.Restart(fault.node);
      break;
    }
    case FaultKind::kFreeze:
      d.Freeze(fault.node);
      absl::SleepFor(fault.hold);
      d.Thaw(fault.node);
      ready = absl::Now();
      break;
    case FaultKind::kFlap: {
      const std::vector<SoakNode> nodes = d.Snapshot();
      auto shape = [&](double gbps) {
        absl::Status s = absl::UnavailableError("no coordinator");
        for (const SoakNode& n : nodes) {
          if (n.role != SoakRole::kCoordinator || !n.up || n.frozen) continue;
          s = SetLinkShapeAt(n.control_address, d.secret(), gbps, 0);
          if (s.ok()) break;
        }
        return s;
      };
      if (absl::Status s = shape(kTrickleGbps); !s.ok()) out.error = std::string(s.message());
      absl::SleepFor(fault.hold);
      const absl::Status s = shape(INFINITY);
      if (!s.ok()) out.error = std::string(s.message());
      ready = absl::Now();
      break;
    }
    case FaultKind::kEtcd:
      d.Kill(fault.node);
      absl::SleepFor(fault.hold);
      ready = d.Restart(fault.node);
      break;
    case FaultKind::kReplace:
      ready = d.Replace(fault.node);
      break;
    case FaultKind::kLinkDown: {
      absl::Status s = d.SetProducerLinkUp(false);
      absl::SleepFor(fault.hold);
      if (absl::Status up = d.SetProducerLinkUp(true); s.ok()) s = up;
      if (!s.ok()) out.error = std::string(s.message());
      ready = absl::Now();
      break;
    }
  }
  if (!ready.ok()) {
    out.error = absl::StrCat("did not come back: ", ready.status().message());
    out.acted = absl::Now();
    return out;
  }
  out.acted = *ready;
  out.recovered = WaitFor([&] { return Serving(d, fault.node, targets); }, max_wait);
  if (out.recovered == absl::InfinitePast()) {
    if (out.error.empty()) out.error = "not serving again within " + absl::FormatDuration(max_wait);
  } else {
    out.recovery_s = absl::ToDoubleSeconds(out.recovered - out.acted);
  }
  return out;
}

bool Probe(const std::string& server, const std::string& target, const std::string& mode) {
  v1::GenerateRequest request;
  request.set_prompt("Once upon a time");
  request.add_targets(target);
  SetRequestModeName(mode, &request);
  request.set_max_tokens(2);
  request.set_deadline_ms(3000);
  bool finished = false;
  const absl::Status status =
      StreamGenerate(server, request, absl::Seconds(3),
                     [&](const v1::GenerateEvent& e) { finished = finished || e.has_finished(); });
  return status.ok() && finished;
}

}  // namespace scd::bench
