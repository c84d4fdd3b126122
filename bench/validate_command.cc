#include "bench/validate_command.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "base/file_util.h"
#include "base/shared_dir.h"
#include "base/status_macros.h"
#include "bench/model_shape.h"
#include "bench/simulate_command.h"
#include "bench/soak_deployment.h"

namespace scd::bench {
namespace {

namespace fs = std::filesystem;

void Say(const ValidateOptions& o, const std::string& line) {
  if (o.progress) std::fprintf(stderr, "scd-bench validate: %s\n", line.c_str());
}

// The twin's shape: what the emulated deployment can be.
absl::Status CheckTwin(const SimDeployment& d) {
  if (d.coordinators != 1 || d.producers.size() != 1 || d.producers[0].count != 1 ||
      d.consumers.size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the emulated deployment's twin must be one coordinator, one producer pool "
                     "of one node and one consumer pool; ",
                     d.name, " has ", d.coordinators, " coordinators, ", d.producers.size(),
                     " producer pools and ", d.consumers.size(), " consumer pools"));
  }
  if (d.producers[0].prefix_cache_mb != d.consumers[0].prefix_cache_mb) {
    return absl::InvalidArgumentError(
        "the emulated nodes share one prefix cache size: the producer and consumer pools' "
        "prefix_cache_mb must be equal");
  }
  return absl::OkStatus();
}

SoakDeploymentSpec RealSpec(const ValidateOptions& o, const SimDeployment& d,
                            const std::string& dir) {
  const SimConsumerPool& pool = d.consumers[0];
  SoakDeploymentSpec spec;
  spec.bin_dir = o.bin_dir;
  spec.dir = dir;
  spec.producer_model = o.producer_model;
  for (int64_t i = 0; i < pool.count; ++i) {
    spec.consumers.push_back({pool.name, o.consumer_model, o.artifact});
  }
  spec.coordinators = 1;
  spec.prefix_cache_mb = static_cast<int>(pool.prefix_cache_mb);
  spec.consumer_capacity = static_cast<int>(pool.costs.capacity);
  spec.producer_cpus = d.producers[0].costs.cpu_quota;
  spec.consumer_cpus = pool.costs.cpu_quota;
  spec.cpu_period = absl::Milliseconds(o.quota_period_ms);
  return spec;
}

// One step of the workload's faults on the real deployment: a node thawed (SIGCONT), restarted,
// frozen (SIGSTOP) or killed (kill -9), in the order of a tie at one instant.
enum class RealFaultAction { kThaw, kRestart, kFreeze, kKill };
struct RealFaultStep {
  absl::Duration at;  // from the replay's start
  int node = 0;       // the deployment's index
  RealFaultAction action = RealFaultAction::kFreeze;
};

// The workload's faults as steps on `deployment`, in time order (a node back before one goes at
// one instant): the twin's producer is the deployment's producer, its consumer I the I-th
// consumer.
absl::StatusOr<std::vector<RealFaultStep>> RealFaultSteps(const SoakDeployment& deployment,
                                                          const SimDeployment& d,
                                                          const SimWorkload& w) {
  std::vector<RealFaultStep> steps;
  for (const SimFault& f : w.faults) {
    SCD_ASSIGN_OR_RETURN(const SimNodeRef ref, FindSimNode(d, f.node));
    int found = -1;
    for (int i = 0, consumer = 0; i < deployment.size() && found < 0; ++i) {
      const SoakRole role = deployment.Node(i).role;
      if (ref.producer ? role == SoakRole::kProducer
                       : role == SoakRole::kConsumer && consumer++ == ref.index) {
        found = i;
      }
    }
    if (found < 0) return absl::NotFoundError(absl::StrCat("no real node for ", f.node));
    const bool kill = f.kind == SimFaultKind::kKill;
    steps.push_back(
        {absl::Seconds(f.at_s), found, kill ? RealFaultAction::kKill : RealFaultAction::kFreeze});
    steps.push_back({absl::Seconds(f.at_s + f.hold_s), found,
                     kill ? RealFaultAction::kRestart : RealFaultAction::kThaw});
  }
  std::sort(steps.begin(), steps.end(), [](const RealFaultStep& a, const RealFaultStep& b) {
    return std::make_tuple(a.at, a.action) < std::make_tuple(b.at, b.action);
  });
  return steps;
}

// The replay (`s`) on a thread of its own while this one, which started the deployment, runs the
// faults' steps at their times from the replay's start (the replay's own clock starts within
// milliseconds of it). A restart returns once the node is ready (its model loaded): the steps
// after it wait for that; a restart that fails is said and the replay goes on.
absl::StatusOr<ServeBenchResult> ReplayWithFaults(const ServeBenchOptions& s,
                                                  SoakDeployment& deployment,
                                                  const std::vector<RealFaultStep>& steps,
                                                  const ValidateOptions& o,
                                                  const std::string& name) {
  absl::StatusOr<ServeBenchResult> result = absl::UnknownError("the replay did not run");
  const absl::Time start = absl::Now();
  std::thread replay([&] { result = RunServeBenchmark(s); });
  for (const RealFaultStep& step : steps) {
    absl::SleepFor(start + step.at - absl::Now());
    const char* did = "froze";
    switch (step.action) {
      case RealFaultAction::kFreeze:
        deployment.Freeze(step.node);
        break;
      case RealFaultAction::kThaw:
        deployment.Thaw(step.node);
        did = "thawed";
        break;
      case RealFaultAction::kKill:
        deployment.Kill(step.node);
        did = "killed";
        break;
      case RealFaultAction::kRestart: {
        const double begun = absl::ToDoubleSeconds(absl::Now() - start);
        absl::StatusOr<absl::Time> ready = deployment.Restart(step.node);
        if (!ready.ok()) {
          Say(o, absl::StrCat(name, ": restarting ", deployment.Node(step.node).name,
                              " failed: ", ready.status().ToString()));
          continue;
        }
        Say(o, absl::StrFormat("%s: restarted %s at %.3f s, ready at %.3f s", name,
                               deployment.Node(step.node).name, begun,
                               absl::ToDoubleSeconds(*ready - start)));
        continue;
      }
    }
    Say(o, absl::StrFormat("%s: %s %s at %.3f s", name, did, deployment.Node(step.node).name,
                           absl::ToDoubleSeconds(absl::Now() - start)));
  }
  replay.join();
  return result;
}

// The workload replayed on a fresh emulated deployment.
absl::Status RunReal(const ValidateOptions& o, const SimDeployment& d, int vocab_size,
                     WorkloadValidation* v) {
  const absl::Time start = absl::Now();
  SCD_ASSIGN_OR_RETURN(const SimReplay replay,
                       ReplayOf(DrawSimRequests(v->workload), v->workload, vocab_size));
  const SoakDeploymentSpec spec = RealSpec(o, d, o.out + "/daemons/" + v->name);
  Say(o, absl::StrFormat("%s: starting the daemons (producer %g CPUs, %zu consumers %g CPUs each)",
                         v->name, spec.producer_cpus, spec.consumers.size(), spec.consumer_cpus));
  SCD_ASSIGN_OR_RETURN(std::unique_ptr<SoakDeployment> deployment, SoakDeployment::Start(spec));
  ServeBenchOptions s;
  s.server = deployment->LiveCoordinators().at(0);
  s.targets = {replay.target};
  s.mode = "auto";
  s.prompts = replay.prompts;
  s.arrivals_s = replay.arrivals_s;
  s.ttft_slo_ms = static_cast<uint32_t>(v->workload.objective_ttft_ms);
  s.timeout = absl::Seconds(300);
  s.percentiles = {50, 90};
  Say(o, absl::StrFormat("%s: %zu requests over %g s", v->name, s.prompts.size(),
                         v->workload.duration_s));
  SCD_ASSIGN_OR_RETURN(const std::vector<RealFaultStep> steps,
                       RealFaultSteps(*deployment, d, v->workload));
  SCD_ASSIGN_OR_RETURN(const ServeBenchResult r,
                       ReplayWithFaults(s, *deployment, steps, o, v->name));
  SCD_RETURN_IF_ERROR(
      WriteStringToFile(absl::StrCat(o.out, "/", v->name, ".real.json"), ServeBenchJson(r, s)));
  v->ran_real = true;
  v->real = FiguresOf(r, v->workload);
  v->real_failures = r.failures_by_code;
  for (int i = 0; i < deployment->size(); ++i) {
    absl::StatusOr<CpuGroupStat> t = deployment->Throttling(i);
    if (t.ok()) v->throttling.emplace_back(deployment->Node(i).name, *t);
  }
  v->real_s = absl::ToDoubleSeconds(absl::Now() - start);
  return absl::OkStatus();
}

absl::Status RunSimulated(const ValidateOptions& o, const SimDeployment& d, WorkloadValidation* v) {
  for (int k = 0; k < o.seeds; ++k) {
    SimWorkload w = v->workload;
    w.seed += static_cast<uint64_t>(k);
    SCD_ASSIGN_OR_RETURN(const ClusterSimResult r, RunClusterSim(d, w, o.drain_s));
    v->seeds.push_back(FiguresOf(r, w));
    if (k == 0) {
      SCD_RETURN_IF_ERROR(WriteStringToFile(absl::StrCat(o.out, "/", v->name, ".simulated.json"),
                                            SimulateJson(r, w, true)));
    }
  }
  v->simulated = v->seeds.at(0);
  v->spread = SpreadOf(v->seeds);
  return absl::OkStatus();
}

nlohmann::json FiguresJson(const RunFigures& f) {
  return {{"requests", f.requests},
          {"completed", f.completed},
          {"good", f.good},
          {"goodput", f.goodput},
          {"ttft_p50_ms", f.ttft_p50_ms},
          {"ttft_p90_ms", f.ttft_p90_ms},
          {"tpot_p50_ms", f.tpot_p50_ms},
          {"tpot_p90_ms", f.tpot_p90_ms},
          {"modes", f.modes}};
}

}  // namespace

bool WorkloadValidation::within() const {
  for (const FigureError& e : errors) {
    if (!e.within()) return false;
  }
  return ran_real;
}

absl::StatusOr<std::vector<WorkloadValidation>> RunValidation(const ValidateOptions& o) {
  if (o.seeds < 1) return absl::InvalidArgumentError("--seeds must be at least 1");
  SCD_ASSIGN_OR_RETURN(const SimDeployment d, ReadSimDeployment(o.deployment));
  SCD_RETURN_IF_ERROR(CheckTwin(d));
  int vocab_size = 0;
  if (o.real) {
    SCD_ASSIGN_OR_RETURN(const ModelShape shape, ReadModelShape(o.consumer_model));
    vocab_size = static_cast<int>(shape.vocab_size);
  }
  std::vector<WorkloadValidation> out;
  for (const std::string& path : o.workloads) {
    WorkloadValidation v;
    v.name = fs::path(path).stem().string();
    SCD_ASSIGN_OR_RETURN(v.workload, ReadSimWorkload(path));
    SCD_RETURN_IF_ERROR(CheckSimWorkload(v.workload, d));
    SCD_RETURN_IF_ERROR(RunSimulated(o, d, &v));
    if (o.real) {
      SCD_RETURN_IF_ERROR(RunReal(o, d, vocab_size, &v));
      v.errors = CompareFigures(v.real, v.simulated);
    }
    Say(o, absl::StrFormat(
               "%s: done%s", v.name,
               v.ran_real ? (v.within() ? ", within the bounds" : ", OUTSIDE a bound") : ""));
    out.push_back(std::move(v));
  }
  return out;
}

std::string ValidationJson(const std::vector<WorkloadValidation>& results) {
  nlohmann::json all = nlohmann::json::array();
  for (const WorkloadValidation& v : results) {
    nlohmann::json seeds = nlohmann::json::array(), spread = nlohmann::json::object(),
                   errors = nlohmann::json::array(), throttling = nlohmann::json::array();
    for (const RunFigures& f : v.seeds) seeds.push_back(FiguresJson(f));
    for (const FigureSpread& s : v.spread) spread[s.figure] = {{"mean", s.mean}, {"std", s.std}};
    for (const FigureError& e : v.errors) {
      errors.push_back({{"figure", e.figure},
                        {"real", e.real},
                        {"simulated", e.simulated},
                        {"error", e.error},
                        {"bound", e.bound},
                        {"within", e.within()}});
    }
    for (const auto& [node, t] : v.throttling) {
      throttling.push_back({{"node", node},
                            {"periods", t.periods},
                            {"throttled", t.throttled},
                            {"throttled_s", absl::ToDoubleSeconds(t.throttled_time)}});
    }
    nlohmann::json j = {{"workload", v.name},
                        {"seed", v.workload.seed},
                        {"rate", v.workload.rate},
                        {"duration_s", v.workload.duration_s},
                        {"simulated", FiguresJson(v.simulated)},
                        {"simulated_seeds", seeds},
                        {"simulated_spread", spread}};
    if (v.ran_real) {
      j["real"] = FiguresJson(v.real);
      j["real_failures"] = v.real_failures;
      j["real_s"] = v.real_s;
      j["errors"] = errors;
      j["within"] = v.within();
      j["throttling"] = throttling;
    }
    all.push_back(j);
  }
  return nlohmann::json{{"workloads", all}}.dump(1);
}

std::string ValidationTable(const std::vector<WorkloadValidation>& results) {
  std::string t =
      "| workload | figure | real | simulated (same requests) | simulated over seeds | error |\n"
      "|---|---|---:|---:|---:|---:|\n";
  for (const WorkloadValidation& v : results) {
    for (size_t i = 0; i < v.spread.size(); ++i) {
      const FigureSpread& s = v.spread[i];
      const bool has_real = v.ran_real && i < v.errors.size();
      const FigureError* e = has_real ? &v.errors[i] : nullptr;
      const double same = FigureValues(v.simulated)[i].second;
      absl::StrAppendFormat(
          &t, "| %s | %s | %s | %.4g | %.4g ± %.2g | %s |\n", i == 0 ? v.name : "", s.figure,
          e ? absl::StrFormat("%.4g", e->real) : "-", same, s.mean, s.std,
          e ? absl::StrFormat("%.1f %%%s", 100 * e->error, e->within() ? "" : " **over**") : "-");
    }
  }
  return t;
}

CLI::App* AddValidateCommand(CLI::App& app, ValidateOptions* o) {
  CLI::App* v = app.add_subcommand(
      "validate",
      "the cluster simulator against real runs: workloads replayed on real daemons under CPU "
      "quotas and simulated from the nodes' profiles");
  v->add_option("--deployment", o->deployment,
                "the emulated deployment's simulated twin (one coordinator, one producer, one "
                "consumer pool)")
      ->required();
  v->add_option("--workload", o->workloads, "a workload file (repeat: each in turn)")->required();
  v->add_option("--producer", o->producer_model, "the producer's model directory");
  v->add_option("--consumer", o->consumer_model, "the consumer's model directory");
  v->add_option("--artifact", o->artifact, "the producer -> consumer artifact");
  v->add_option("--out", o->out, "validation.json, validation.md, the daemons' logs")->required();
  v->add_option("--seeds", o->seeds, "simulated runs per workload (the spread)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  v->add_option("--quota-period-ms", o->quota_period_ms, "the CPU quotas' period")
      ->check(CLI::Range(1.0, 1000.0))
      ->capture_default_str();
  v->add_option("--drain", o->drain_s, "the simulator's drain after the last arrival (s)")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  v->add_flag(
      "--simulated-only", [o](int64_t) { o->real = false; }, "no real runs");
  v->add_flag(
      "--quiet", [o](int64_t) { o->progress = false; }, "no progress lines");
  return v;
}

absl::Status RunValidateCommand(ValidateOptions o) {
  if (o.real && (o.producer_model.empty() || o.consumer_model.empty() || o.artifact.empty())) {
    return absl::InvalidArgumentError(
        "real runs need --producer, --consumer and --artifact (or --simulated-only)");
  }
  o.bin_dir = ExecutableDir();
  fs::create_directories(o.out);
  o.out = fs::absolute(o.out).string();
  SCD_ASSIGN_OR_RETURN(const std::vector<WorkloadValidation> results, RunValidation(o));
  const std::string table = ValidationTable(results);
  SCD_RETURN_IF_ERROR(
      WriteStringToFile(o.out + "/validation.json", ValidationJson(results) + "\n"));
  SCD_RETURN_IF_ERROR(WriteStringToFile(o.out + "/validation.md", table));
  std::printf("%s", table.c_str());
  return absl::OkStatus();
}

}  // namespace scd::bench
