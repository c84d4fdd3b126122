#include "bench/plan_command.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/file_util.h"
#include "base/status_macros.h"
#include "bench/cluster_sim.h"
#include "bench/serve_benchmark.h"

namespace scd::bench {
namespace {

namespace fs = std::filesystem;

constexpr char kRawCaveat[] =
    "raw sends the producer's own KV cache: faithful only where the consumer has the producer's "
    "weights; between different weights the coordinator serves it degraded (refused with "
    "--strict-modes). Count a raw plan only for such a pair.";

bool SearchesRaw(const std::vector<RequestedMode>& policies) {
  return std::find(policies.begin(), policies.end(), RequestedMode(TransferMode::kRaw)) !=
         policies.end();
}

absl::StatusOr<std::vector<RequestedMode>> ParsePolicies(const std::string& text) {
  std::vector<RequestedMode> out;
  for (absl::string_view name : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    absl::StatusOr<RequestedMode> mode = ParseRequestedMode(std::string(name));
    if (!mode.ok() || name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--policies: '", name, "': local, raw, scd or auto"));
    }
    out.push_back(*mode);
  }
  return out;
}

std::string CandidateName(const PlanCandidate& c) {
  return absl::StrFormat("%s: producers %d, consumers %d", RequestedModeName(c.policy), c.producers,
                         c.consumers);
}

nlohmann::json EvaluationJson(const PlanEvaluation& e) {
  return {{"policy", RequestedModeName(e.candidate.policy)},
          {"producers", e.candidate.producers},
          {"consumers", e.candidate.consumers},
          {"cost", e.cost},
          {"attainment", e.outcome.attainment},
          {"goodput", e.outcome.goodput},
          {"goodput_per_node", e.goodput_per_node()},
          {"ttft_p90_ms", e.outcome.ttft_p90_ms},
          {"tpot_p90_ms", e.outcome.tpot_p90_ms},
          {"codes_share", e.outcome.codes_share},
          {"meets", e.meets},
          {"minimal", e.minimal}};
}

nlohmann::json PlanJson(const PlanResult& r, const PlanSpace& space, const SimWorkload& w,
                        const PlanFlags& f) {
  nlohmann::json runs = nlohmann::json::array();
  for (const PlanEvaluation& e : r.evaluated) runs.push_back(EvaluationJson(e));
  auto pick = [&](int i) {
    return i < 0 ? nlohmann::json() : EvaluationJson(r.evaluated[static_cast<size_t>(i)]);
  };
  nlohmann::json policies = nlohmann::json::array();
  for (RequestedMode p : space.policies) policies.push_back(RequestedModeName(p));
  return {{"deployment", f.deployment},
          {"workload", f.workload},
          {"rate", w.rate},
          {"duration_s", w.duration_s},
          {"ttft_slo_ms", w.ttft_slo_ms},
          {"tpot_slo_ms", w.tpot_slo_ms},
          {"attainment", space.attainment},
          {"seeds", f.seeds},
          {"link_gbps", f.link_gbps},
          {"policies", policies},
          {"max_producers", space.max_producers},
          {"max_consumers", space.max_consumers},
          {"producer_cost", space.producer_cost},
          {"consumer_cost", space.consumer_cost},
          {"plan", pick(r.best)},
          {"runner_up", pick(r.runner_up)},
          {"evaluated", runs}};
}

std::string EvaluationRow(const PlanEvaluation& e, const std::string& mark) {
  return absl::StrFormat(
      "| %s | %d | %d | %g | %.3f | %.2f | %.3f | %.1f | %.2f | %.0f %% | %s |\n",
      RequestedModeName(e.candidate.policy), e.candidate.producers, e.candidate.consumers, e.cost,
      e.outcome.attainment, e.outcome.goodput, e.goodput_per_node(), e.outcome.ttft_p90_ms,
      e.outcome.tpot_p90_ms, e.outcome.codes_share * 100, mark);
}

std::string PlanMarkdown(const PlanResult& r, const PlanSpace& space, const SimWorkload& w,
                         const PlanFlags& f) {
  std::string out = absl::StrFormat(
      "# scd-bench plan\n\n%s under %s: %g requests/s for %g s; SLOs TTFT %g ms, TPOT %g ms "
      "(0: none), met by %g of requests (the worst of %d seeds)%s.\n\n",
      f.deployment, f.workload, w.rate, w.duration_s, w.ttft_slo_ms, w.tpot_slo_ms,
      space.attainment, f.seeds,
      f.link_gbps > 0 ? absl::StrFormat("; every link %g Gbit/s", f.link_gbps) : "");
  if (SearchesRaw(space.policies)) {
    absl::StrAppend(&out, kRawCaveat, "\n\n");
  }
  for (const auto& [label, i] :
       {std::pair<const char*, int>{"Plan", r.best}, {"Runner-up", r.runner_up}}) {
    if (i < 0) {
      absl::StrAppend(&out, label, ": none within the bounds meets the SLOs.\n");
      continue;
    }
    const PlanEvaluation& e = r.evaluated[static_cast<size_t>(i)];
    absl::StrAppend(&out,
                    absl::StrFormat("%s: **%s** -- cost %g, goodput %.2f/s, %.3f per node, "
                                    "attainment %.3f.\n",
                                    label, CandidateName(e.candidate), e.cost, e.outcome.goodput,
                                    e.goodput_per_node(), e.outcome.attainment));
  }
  absl::StrAppend(&out,
                  "\nEvery candidate run, in order:\n\n| policy | producers | consumers | cost | "
                  "attainment | goodput (/s) | per node | TTFT p90 (ms) | TPOT p90 (ms) | codes "
                  "| |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (size_t i = 0; i < r.evaluated.size(); ++i) {
    const PlanEvaluation& e = r.evaluated[i];
    const int n = static_cast<int>(i);
    const std::string mark = n == r.best        ? "plan"
                             : n == r.runner_up ? "runner-up"
                             : e.minimal        ? "meets (minimal)"
                             : e.meets          ? "meets"
                                                : "";
    absl::StrAppend(&out, EvaluationRow(e, mark));
  }
  return out;
}

// A path written in the template (a profile, a trace), relative to `out_dir`.
std::string RelativeTo(const std::string& path, const std::string& template_dir,
                       const std::string& out_dir) {
  const fs::path p(path);
  const fs::path full =
      (p.is_absolute() ? p : fs::absolute(fs::path(template_dir) / p)).lexically_normal();
  const fs::path rel = full.lexically_relative(fs::absolute(out_dir).lexically_normal());
  return rel.empty() ? full.string() : rel.string();
}

absl::Status WritePlan(const PlanResult& r, const PlanSpace& space, const SimDeployment& tmpl,
                       const SimWorkload& w, const PlanFlags& f) {
  std::error_code ec;
  fs::create_directories(f.out, ec);
  if (ec) return absl::InternalError(absl::StrCat(f.out, ": ", ec.message()));
  SCD_RETURN_IF_ERROR(
      WriteStringToFile(f.out + "/plan.json", PlanJson(r, space, w, f).dump(1) + "\n"));
  SCD_RETURN_IF_ERROR(WriteStringToFile(f.out + "/plan.md", PlanMarkdown(r, space, w, f)));
  if (r.best < 0) return absl::OkStatus();
  const PlanEvaluation& best = r.evaluated[static_cast<size_t>(r.best)];
  SCD_ASSIGN_OR_RETURN(SimDeployment d,
                       PlanDeployment(tmpl, best.candidate, f.link_gbps, f.link_latency_us));
  const std::string dir = fs::path(f.deployment).parent_path().string();
  for (SimProducerPool& p : d.producers) p.profile = RelativeTo(p.profile, dir, f.out);
  for (SimConsumerPool& c : d.consumers) c.profile = RelativeTo(c.profile, dir, f.out);
  for (SimLink& l : d.links) {
    if (!l.trace.empty()) l.trace = RelativeTo(l.trace, dir, f.out);
  }
  const std::string header = absl::StrFormat(
      "scd-bench plan: %s\nrequests ask mode \"%s\" (the workload's [[mix]] mode)\n"
      "predicted under %s: goodput %.2f/s, %.3f per node, attainment %.3f",
      CandidateName(best.candidate), RequestedModeName(best.candidate.policy), f.workload,
      best.outcome.goodput, best.goodput_per_node(), best.outcome.attainment);
  return WriteStringToFile(f.out + "/deployment.toml", SimDeploymentToml(d, header));
}

}  // namespace

absl::StatusOr<SimDeployment> PlanDeployment(const SimDeployment& tmpl, const PlanCandidate& c,
                                             double link_gbps, double link_latency_us) {
  if (tmpl.producers.size() != 1 || tmpl.consumers.size() != 1 ||
      tmpl.consumers[0].producer != tmpl.producers[0].name) {
    return absl::InvalidArgumentError(
        "plan searches one pair: a deployment of one producer pool and one consumer pool "
        "taking its codes");
  }
  SimDeployment d = tmpl;
  d.consumers[0].count = c.consumers;
  if (link_gbps > 0) {
    const SimLink was = tmpl.LinkOf(0, 0);
    d.links = {{was.producer, was.consumer, link_gbps,
                link_latency_us >= 0 ? link_latency_us : was.latency_us, "", nullptr}};
  }
  if (c.producers > 0) {
    d.producers[0].count = c.producers;
  } else {
    d.producers.clear();
    d.links.clear();
    d.consumers[0].producer.clear();
  }
  return d;
}

SimWorkload PlanWorkload(const SimWorkload& workload, RequestedMode policy) {
  SimWorkload w = workload;
  for (SimMix& m : w.mix) m.mode = policy;
  return w;
}

absl::StatusOr<PlanOutcome> EvaluatePlan(const SimDeployment& d, const SimWorkload& workload,
                                         int64_t seeds, double drain_s) {
  PlanOutcome o;
  o.attainment = 1;
  int64_t finished = 0, codes = 0;
  for (int64_t s = 0; s < seeds; ++s) {
    SimWorkload w = workload;
    w.seed = workload.seed + static_cast<uint64_t>(s);
    SCD_ASSIGN_OR_RETURN(const ClusterSimResult r, RunClusterSim(d, w, drain_s));
    std::vector<double> ttft, tpot;
    int64_t good = 0;
    for (const SimRequestResult& q : r.requests) {
      if (q.code != absl::StatusCode::kOk) continue;
      ++finished;
      codes += q.mode == TransferMode::kLocal ? 0 : 1;
      ttft.push_back(q.ttft_s);
      if (q.output_tokens > 1) tpot.push_back(q.tpot_s());
      good += MeetsSlo(w, q.ttft_s, q.tpot_s()) ? 1 : 0;
    }
    const double requests = static_cast<double>(std::max<size_t>(r.requests.size(), 1));
    o.attainment = std::min(o.attainment, static_cast<double>(good) / requests);
    o.goodput += static_cast<double>(good) / w.duration_s / static_cast<double>(seeds);
    o.ttft_p90_ms += Summarize(ttft, {90}).percentiles[90] / static_cast<double>(seeds);
    o.tpot_p90_ms += Summarize(tpot, {90}).percentiles[90] / static_cast<double>(seeds);
  }
  o.codes_share = finished > 0 ? static_cast<double>(codes) / static_cast<double>(finished) : 0;
  return o;
}

CLI::App* AddPlanCommand(CLI::App& app, PlanFlags* f) {
  CLI::App* p = app.add_subcommand(
      "plan",
      "the cheapest deployment of a model pair (pool sizes and a mode policy) that meets a "
      "workload's SLOs, searched in the cluster simulator");
  p->add_option("--deployment", f->deployment,
                "the template: one producer pool, one consumer pool taking its codes")
      ->required();
  p->add_option("--workload", f->workload, "the traffic and its SLOs")->required();
  p->add_option("--out", f->out, "plan.json, plan.md, deployment.toml here")->required();
  p->add_option("--policies", f->policies,
                "mode policies searched, in order (raw only for a consumer with the producer's "
                "weights)")
      ->capture_default_str();
  p->add_option("--max-producers", f->max_producers, "producers searched up to")
      ->check(CLI::Range(int64_t{1}, int64_t{10000}))
      ->capture_default_str();
  p->add_option("--max-consumers", f->max_consumers, "consumers searched up to")
      ->check(CLI::Range(int64_t{1}, int64_t{10000}))
      ->capture_default_str();
  p->add_option("--producer-cost", f->producer_cost, "a producer node's price")
      ->check(CLI::Range(1e-6, 1e6))
      ->capture_default_str();
  p->add_option("--consumer-cost", f->consumer_cost, "a consumer node's price")
      ->check(CLI::Range(1e-6, 1e6))
      ->capture_default_str();
  p->add_option("--attainment", f->attainment, "the share of requests that must meet the SLOs")
      ->check(CLI::Range(1e-6, 1.0))
      ->capture_default_str();
  p->add_option("--seeds", f->seeds, "runs per candidate (the worst seed judged)")
      ->check(CLI::Range(int64_t{1}, int64_t{100}))
      ->capture_default_str();
  p->add_option("--link-gbps", f->link_gbps, "every link at this goodput (0: the deployment's)")
      ->check(CLI::Range(0.0, 1e6));
  p->add_option("--link-latency-us", f->link_latency_us, "and this latency")
      ->check(CLI::Range(0.0, 1e9));
  p->add_option("--ttft-slo-ms", f->ttft_slo_ms, "instead of the workload's (0: none)")
      ->check(CLI::Range(0.0, 1e9));
  p->add_option("--tpot-slo-ms", f->tpot_slo_ms, "instead of the workload's (0: none)")
      ->check(CLI::Range(0.0, 1e9));
  p->add_option("--drain", f->drain_s, "seconds after the last arrival before what runs is ended")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  p->add_flag("--quiet{false}", f->progress, "no line per candidate on stderr");
  return p;
}

absl::Status RunPlanCommand(const PlanFlags& f) {
  SCD_ASSIGN_OR_RETURN(const SimDeployment tmpl, ReadSimDeployment(f.deployment));
  SCD_ASSIGN_OR_RETURN(SimWorkload w, ReadSimWorkload(f.workload));
  if (f.ttft_slo_ms >= 0) w.ttft_slo_ms = f.ttft_slo_ms;
  if (f.tpot_slo_ms >= 0) w.tpot_slo_ms = f.tpot_slo_ms;
  if (w.ttft_slo_ms <= 0 && w.tpot_slo_ms <= 0) {
    return absl::InvalidArgumentError(
        "plan needs an SLO: the workload's [slo] ttft_ms or tpot_ms, or --ttft-slo-ms");
  }
  PlanSpace space;
  SCD_ASSIGN_OR_RETURN(space.policies, ParsePolicies(f.policies));
  if (f.progress && SearchesRaw(space.policies)) {
    std::fprintf(stderr, "plan: %s\n", kRawCaveat);
  }
  space.max_producers = f.max_producers;
  space.max_consumers = f.max_consumers;
  space.producer_cost = f.producer_cost;
  space.consumer_cost = f.consumer_cost;
  space.attainment = f.attainment;
  for (RequestedMode policy : space.policies) {  // a template or mix that cannot run: now
    SCD_ASSIGN_OR_RETURN(const SimDeployment d,
                         PlanDeployment(tmpl, {policy, policy.Is(TransferMode::kLocal) ? 0 : 1, 1},
                                        f.link_gbps, f.link_latency_us));
    SCD_RETURN_IF_ERROR(CheckSimWorkload(PlanWorkload(w, policy), d));
  }
  int64_t runs = 0;
  SCD_ASSIGN_OR_RETURN(
      const PlanResult r,
      SearchPlan(space, [&](const PlanCandidate& c) -> absl::StatusOr<PlanOutcome> {
        SCD_ASSIGN_OR_RETURN(const SimDeployment d,
                             PlanDeployment(tmpl, c, f.link_gbps, f.link_latency_us));
        SCD_ASSIGN_OR_RETURN(const PlanOutcome o,
                             EvaluatePlan(d, PlanWorkload(w, c.policy), f.seeds, f.drain_s));
        if (f.progress) {
          std::fprintf(stderr, "plan: run %ld: %s: attainment %.3f, goodput %.2f/s%s\n", ++runs,
                       CandidateName(c).c_str(), o.attainment, o.goodput,
                       o.attainment >= space.attainment ? " (meets)" : "");
        }
        return o;
      }));
  SCD_RETURN_IF_ERROR(WritePlan(r, space, tmpl, w, f));
  std::printf("%s", PlanMarkdown(r, space, w, f).c_str());
  if (r.best >= 0) return absl::OkStatus();
  const auto nearest = std::max_element(r.evaluated.begin(), r.evaluated.end(),
                                        [](const PlanEvaluation& a, const PlanEvaluation& b) {
                                          return a.outcome.attainment < b.outcome.attainment;
                                        });
  return absl::NotFoundError(absl::StrFormat(
      "no deployment within %d producers and %d consumers meets the SLOs for %g of requests; "
      "the nearest, %s, met them for %.3f (%s/plan.md)",
      f.max_producers, f.max_consumers, f.attainment,
      nearest == r.evaluated.end() ? "none" : CandidateName(nearest->candidate),
      nearest == r.evaluated.end() ? 0.0 : nearest->outcome.attainment, f.out));
}

}  // namespace scd::bench
