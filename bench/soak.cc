#include "bench/soak.h"

#include <filesystem>
#include <fstream>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/child_process.h"
#include "base/progress.h"
#include "base/random_id.h"
#include "base/status_macros.h"
#include "bench/bandwidth_sweep.h"
#include "bench/quick_artifact.h"
#include "bench/soak_load.h"
#include "bench/soak_workload.h"

namespace scd::bench {
namespace {

namespace fs = std::filesystem;

const std::vector<std::string> kTargets = {"fables", "xs"};
const std::vector<std::string> kReferenceModes = {"local", "raw", "scd"};
constexpr int kPromptGroups = 4, kPromptsPerGroup = 6;

struct Pair {
  std::string name, model;
};

// The producer -> consumer artifact, fitted quickly once (kept under OUT/artifacts,
// bench/quick_artifact.h): the soak needs real translators, not good ones; its one frontier point
// is the point the references were served with.
absl::StatusOr<std::string> Artifact(const SoakOptions& o, const std::string& producer,
                                     const Pair& pair) {
  fs::create_directories(o.out + "/artifacts");
  return FitQuickArtifact(o.bin_dir, o.shared_dir, producer, pair.model,
                          o.out + "/artifacts/" + pair.name + ".scd");
}

// Every (prompt, target, mode) served alone by an all-in-one server, started and stopped here.
absl::StatusOr<SoakReferences> References(const SoakOptions& o, const std::string& producer,
                                          const std::vector<std::string>& consumers,
                                          const std::vector<std::string>& prompts,
                                          uint32_t max_tokens) {
  const std::string dir = o.out + "/reference";
  fs::create_directories(dir);
  fs::remove(dir + "/server.addr");
  const std::string secret = dir + "/cluster-secret";
  std::ofstream(secret) << RandomId128() << RandomId128() << "\n";
  std::vector<std::string> argv = {o.bin_dir + "/scd",
                                   "serve",
                                   "--all-in-one",
                                   "--producer-model",
                                   producer,
                                   "--listen",
                                   "127.0.0.1:0",
                                   "--address-file",
                                   dir + "/server.addr",
                                   "--cluster-secret-file",
                                   secret,
                                   "--threads",
                                   "1"};
  for (const std::string& c : consumers) argv.insert(argv.end(), {"--consumer", c});
  SCD_ASSIGN_OR_RETURN(ChildProcess server, ChildProcess::Start(argv, dir + "/server.log"));
  SCD_ASSIGN_OR_RETURN(std::string address,
                       server.WaitForFile(dir + "/server.addr", absl::Seconds(60)));
  std::unique_ptr<Progress> bar;
  auto progress = [&](int done, int total) {
    if (!o.progress) return;
    if (bar == nullptr) bar = std::make_unique<Progress>("references", total);
    bar->Advance();
    (void)done;
  };
  absl::StatusOr<SoakReferences> refs =
      SoakReferences::Compute(address, prompts, kTargets, kReferenceModes, max_tokens, progress);
  server.Terminate(absl::Seconds(10));
  return refs;
}

// Whether node `i` holds nothing a request held: "" or what it still holds.
std::string Held(const v1::NodeStats& s) {
  std::string held;
  auto add = [&](const char* what, uint64_t n) {
    if (n != 0) absl::StrAppend(&held, held.empty() ? "" : ", ", what, " ", n);
  };
  add("running", s.running());
  add("open_sessions", s.open_sessions());
  add("held_payload_bytes", s.held_payload_bytes());
  add("queued", s.queued());
  add("kv_reserved_bytes", s.kv_reserved_bytes());
  add("sequences", s.sequences());
  return held;
}

// Waits (at most `limit`) until every node but etcd holds nothing; the time it took, or -1.
double Settle(const SoakDeployment& d, absl::Duration limit, std::vector<std::string>* held) {
  const absl::Time start = absl::Now();
  for (;;) {
    held->assign(static_cast<size_t>(d.size()), "");
    bool clear = true;
    for (int i = 0; i < d.size(); ++i) {
      if (d.Node(i).role == SoakRole::kEtcd) continue;
      std::string& h = (*held)[static_cast<size_t>(i)];
      if (d.Node(i).role == SoakRole::kCoordinator) {
        // A coordinator's Stats.running counts its nodes; what it routes is Health's.
        absl::StatusOr<v1::HealthResponse> health = d.Health(i);
        h = !health.ok() ? absl::StrCat("no Health: ", health.status().message())
            : health->active_requests() > 0
                ? absl::StrCat("active_requests ", health->active_requests())
                : "";
      } else {
        absl::StatusOr<v1::NodeStats> stats = d.Stats(i);
        h = stats.ok() ? Held(*stats) : absl::StrCat("no Stats: ", stats.status().message());
      }
      clear = clear && h.empty();
    }
    if (clear) return absl::ToDoubleSeconds(absl::Now() - start);
    if (absl::Now() - start > limit) return -1;
    absl::SleepFor(absl::Milliseconds(200));
  }
}

// Each process's lowest descriptor and thread counts over `samples` reads 250 ms apart: a
// connection or a pool thread that lives for a moment is not a level.
std::vector<ProcSample> Levels(const SoakDeployment& d, int samples) {
  std::vector<ProcSample> low(static_cast<size_t>(d.size()));
  for (int k = 0; k < samples; ++k) {
    if (k > 0) absl::SleepFor(absl::Milliseconds(250));
    for (int i = 0; i < d.size(); ++i) {
      const ProcSample s = d.Sample(i);
      ProcSample& l = low[static_cast<size_t>(i)];
      if (!s.ok) continue;
      if (!l.ok || s.fds < l.fds) {
        l.fds = s.fds;
        l.fd_kinds = s.fd_kinds;
      }
      if (!l.ok || s.own_threads() < l.own_threads()) {
        l.threads = s.threads;
        l.grpc_threads = s.grpc_threads;
        l.thread_names = s.thread_names;
      }
      l.rss_bytes = s.rss_bytes;
      l.rss_anon_bytes = s.rss_anon_bytes;
      l.ok = true;
    }
  }
  return low;
}

bool AtOrBelow(const ProcSample& level, const ProcSample& baseline) {
  return level.ok && level.fds <= baseline.fds && level.own_threads() <= baseline.own_threads();
}

// The levels after the load, read until every process is back at or below its baseline (gRPC's
// pools shrink a while after the load) or `limit` passed; `took_s`: how long (-1: not back).
std::vector<ProcSample> LevelsBackTo(const SoakDeployment& d,
                                     const std::vector<ProcSample>& baseline, absl::Duration limit,
                                     double* took_s) {
  const absl::Time start = absl::Now();
  for (;;) {
    std::vector<ProcSample> levels = Levels(d, 4);
    bool back = true;
    for (size_t i = 0; i < levels.size(); ++i) {
      if (d.Node(static_cast<int>(i)).role == SoakRole::kEtcd) continue;
      back = back && AtOrBelow(levels[i], baseline[i]);
    }
    *took_s = absl::ToDoubleSeconds(absl::Now() - start);
    if (back) return levels;
    if (absl::Now() - start > limit) {
      *took_s = -1;
      return levels;
    }
  }
}

// What of `end` is more than of `baseline`, by kind: "scd-send +2, scd-timers +1" ("" when none).
std::string Grown(const std::map<std::string, int>& baseline,
                  const std::map<std::string, int>& end) {
  std::vector<std::string> grown;
  for (const auto& [kind, n] : end) {
    const auto before = baseline.find(kind);
    const int more = n - (before == baseline.end() ? 0 : before->second);
    if (more > 0) grown.push_back(absl::StrCat(kind, " +", more));
  }
  return absl::StrJoin(grown, ", ");
}

void Verdict(SoakReport& r) {
  const SoakTally& t = r.tally;
  auto fail = [&](std::string why) { r.failures.push_back(std::move(why)); };
  const int64_t unexplained = t.outcomes.count("unexplained") ? t.outcomes.at("unexplained") : 0;
  if (unexplained > 0) fail(absl::StrCat(unexplained, " unexplained failures"));
  if (t.wrong_tokens > 0) fail(absl::StrCat(t.wrong_tokens, " wrong-token streams"));
  if (t.no_terminal > 0) fail(absl::StrCat(t.no_terminal, " streams without a terminal event"));
  if (t.violations > t.wrong_tokens) {
    fail(absl::StrCat(t.violations - t.wrong_tokens, " other per-request violations"));
  }
  if (t.deadline_overruns > 0) fail(absl::StrCat(t.deadline_overruns, " deadline overruns"));
  const SoakOptions& o = r.options;
  const int64_t migrations = t.moves - t.resumes;  // moves to another replica
  if (migrations < o.min_moves || t.resumes < o.min_resumes || t.fallbacks < o.min_fallbacks) {
    fail(absl::StrCat("too little went on past its fault to count: ", migrations,
                      " moves to another replica (at least ", o.min_moves, "), ", t.resumes,
                      " resumes (", o.min_resumes, "), ", t.fallbacks, " fallbacks (",
                      o.min_fallbacks, ")"));
  }
  for (const FaultOutcome& f : r.faults) {
    if (!f.ok()) {
      fail(absl::StrCat(
          FaultKindName(f.fault.kind), " ", f.node, ": ",
          f.error.empty() ? "recovery out of bound" : f.error,
          f.out_of_routing_s >= 0 ? absl::StrCat(" (out of routing in ", f.out_of_routing_s, " s)")
                                  : "",
          f.recovery_s >= 0 ? absl::StrCat(" (served again in ", f.recovery_s, " s)") : ""));
    }
  }
  std::vector<FaultKind> kinds(std::begin(kAllFaultKinds), std::end(kAllFaultKinds));
  if (o.link == "netns") kinds.push_back(FaultKind::kLinkDown);
  for (FaultKind kind : kinds) {
    bool ran = false;
    for (const FaultOutcome& f : r.faults) ran = ran || f.fault.kind == kind;
    if (ran) {
      r.fault_kinds_run.push_back(FaultKindName(kind));
    } else {
      fail(absl::StrCat("no ", FaultKindName(kind), " fault ran (the load was too short)"));
    }
  }
  if (r.settle_s < 0) fail("nodes still held requests' resources 30 s after the load");
  for (const NodeResources& n : r.nodes) {
    if (!n.held_nothing) fail(absl::StrCat(n.name, " still holds: ", n.held));
    if (n.role == SoakRole::kEtcd) continue;
    if (!AtOrBelow(n.end, n.baseline)) {
      fail(absl::StrCat(
          n.name, ": ", n.end.fds, " descriptors and ", n.end.own_threads(),
          " threads (gRPC's pools aside) at the end; ", n.baseline.fds, " and ",
          n.baseline.own_threads(),
          " before the load (more descriptors: ", Grown(n.baseline.fd_kinds, n.end.fd_kinds),
          "; more threads: ", Grown(n.baseline.thread_names, n.end.thread_names), ")"));
    }
    if (n.rss_requests >= r.options.rss_min_requests &&
        n.rss_growth_mb_per_1k >= r.options.rss_bound_mb_per_1k) {
      fail(absl::StrCat(n.name, ": RSS grew ", n.rss_growth_mb_per_1k, " MB per 1,000 requests"));
    }
  }
}

}  // namespace

absl::StatusOr<SoakReport> RunSoak(const SoakOptions& o) {
  if (!(o.rate > 0) || o.workers < 1 || o.duration <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("soak: rate, workers and duration must be positive");
  }
  fs::create_directories(o.out);
  const std::string models = o.shared_dir + "/models/";
  const std::string producer = models + "stories260k";
  const std::vector<Pair> pairs = {{"fables", models + "stories260k-fables"},
                                   {"xs", models + "llama2xs-260k"}};
  std::map<std::string, std::string> artifacts;
  std::vector<std::string> reference_consumers;
  for (const Pair& p : pairs) {
    SCD_ASSIGN_OR_RETURN(artifacts[p.name], Artifact(o, producer, p));
    reference_consumers.push_back(p.name + "=" + p.model + ":" + artifacts[p.name]);
  }
  SCD_ASSIGN_OR_RETURN(std::vector<std::string> prompts,
                       SoakPrompts(o.shared_dir + "/data/tinystories_train_prompts.txt",
                                   kPromptGroups, kPromptsPerGroup));
  SoakMix mix;
  mix.targets = kTargets;
  SCD_ASSIGN_OR_RETURN(SoakReferences refs, References(o, producer, reference_consumers, prompts,
                                                       static_cast<uint32_t>(mix.max_tokens)));
  double tie = 0;
  for (const Pair& p : pairs) {
    SCD_ASSIGN_OR_RETURN(double t, NearTieBound(p.model));
    tie = std::max(tie, t);
  }

  SoakDeploymentSpec spec;
  spec.bin_dir = o.bin_dir;
  spec.dir = o.out + "/nodes";
  spec.producer_model = producer;
  spec.transport = o.transport;
  spec.producer_netns = o.link == "netns";
  spec.consumers = {{"fables", pairs[0].model, artifacts["fables"]},
                    {"fables", pairs[0].model, artifacts["fables"]},
                    {"xs", pairs[1].model, artifacts["xs"]}};
  SCD_ASSIGN_OR_RETURN(std::unique_ptr<SoakDeployment> d, SoakDeployment::Start(spec));
  SoakReplicas replicas;
  for (const auto& c : spec.consumers) ++replicas[c.name];
  // The producer's links made reshapable before the warm-up, as the first flap would make them:
  // a link that may be reshaped carries a shaper (a thread per connection), and the baseline
  // counts what the schedule will leave in place.
  for (const SoakNode& n : d->Snapshot()) {
    if (n.role != SoakRole::kCoordinator) continue;
    SCD_RETURN_IF_ERROR(SetLinkShapeAt(n.control_address, d->secret(), INFINITY, 0));
    break;
  }
  const SoakChecks checks{&prompts, &refs, tie};
  SoakWarmUp(*d, kTargets, checks, 24);
  SoakWarmUp(*d, kTargets, checks, 24);
  SoakReport report;
  report.options = o;
  report.replicas = replicas;
  std::vector<std::string> held;
  if (Settle(*d, absl::Seconds(30), &held) < 0) {
    std::string what;
    for (int i = 0; i < d->size(); ++i) {
      const std::string& h = held[static_cast<size_t>(i)];
      if (!h.empty()) absl::StrAppend(&what, " ", d->Node(i).name, ": ", h, ";");
    }
    return absl::FailedPreconditionError(
        absl::StrCat("30 s after the warm-up the nodes still hold requests' resources:", what));
  }
  report.nodes.resize(static_cast<size_t>(d->size()));
  const std::vector<ProcSample> baseline = Levels(*d, 8);
  for (int i = 0; i < d->size(); ++i) {
    NodeResources& n = report.nodes[static_cast<size_t>(i)];
    n.name = d->Node(i).name;
    n.role = d->Node(i).role;
    n.baseline = baseline[static_cast<size_t>(i)];
  }

  SoakLoad load(*d, mix, checks, o.rate, o.workers, o.seed);
  SoakSampler sampler(*d, load, o.duration, o.progress);
  report.load_start = absl::Now();
  const absl::Time load_end = report.load_start + o.duration;
  load.Start(load_end);
  sampler.Start(report.load_start);
  // The faults: cycles through every kind, a steady gap before each; none starts after the
  // load's last 20 s (its recovery is part of the run).
  auto steady = [&] { absl::SleepFor(std::min(o.fault_gap, load_end - absl::Now())); };
  steady();
  for (int cycle = 0; absl::Now() + absl::Seconds(20) < load_end; ++cycle) {
    for (const SoakFault& fault : SoakFaultCycle(d->Snapshot(), cycle, spec.producer_netns)) {
      if (absl::Now() + absl::Seconds(20) >= load_end) break;
      const std::string label = absl::StrCat(FaultKindName(fault.kind),
                                             fault.node >= 0 ? " " + d->Node(fault.node).name : "");
      sampler.SetFault(label);
      report.faults.push_back(RunSoakFault(*d, fault, kTargets));
      sampler.SetFault("");
      steady();
    }
  }
  report.records = load.Finish();
  report.load_end = absl::Now();
  report.settle_s = Settle(*d, absl::Seconds(30), &held);
  const std::vector<std::vector<RssPoint>> rss = sampler.Stop();
  const std::vector<ProcSample> end =
      LevelsBackTo(*d, baseline, absl::Seconds(30), &report.levels_back_s);
  for (int i = 0; i < d->size(); ++i) {
    NodeResources& n = report.nodes[static_cast<size_t>(i)];
    n.generation = d->Node(i).generation;
    n.end = end[static_cast<size_t>(i)];
    n.held = held[static_cast<size_t>(i)];
    n.held_nothing = n.held.empty();
    const RssGrowth growth = MeasureRssGrowth(rss[static_cast<size_t>(i)]);
    n.rss_growth_mb_per_1k = growth.mb_per_1k;
    n.rss_anon_growth_mb_per_1k = growth.anon_mb_per_1k;
    n.rss_requests = growth.requests;
    n.rss_generation = growth.generation;
  }
  report.windows = FaultWindows(report.faults, report.load_end, o.grace);
  report.tally = TallySoak(report.records, report.windows, o.deadline_bound, report.replicas);
  Verdict(report);
  return report;
}

}  // namespace scd::bench
