#include "bench/simulate_command.h"

#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "absl/strings/str_format.h"
#include "base/file_util.h"
#include "base/status_macros.h"
#include "bench/serve_benchmark.h"

namespace scd::bench {
namespace {

nlohmann::json SummaryJson(const MetricSummary& s) {
  nlohmann::json p = nlohmann::json::object();
  for (const auto& [at, v] : s.percentiles) p[absl::StrFormat("p%g", at)] = v;
  return {{"mean_ms", s.mean},
          {"median_ms", s.median},
          {"std_ms", s.std},
          {"percentiles_ms", p},
          {"count", s.count}};
}

nlohmann::json PerStreamJson(const ClusterSimResult& r) {
  nlohmann::json j = nlohmann::json::object();
  for (const char* key : {"arrival_s", "ttft_ms", "e2el_ms", "input_len", "output_len", "mode",
                          "code", "target", "producer_cached_tokens", "consumer_cached_tokens"}) {
    j[key] = nlohmann::json::array();
  }
  for (const SimRequestResult& q : r.requests) {
    const bool ok = q.code == absl::StatusCode::kOk;
    j["arrival_s"].push_back(q.arrival_s);
    j["ttft_ms"].push_back(ok ? q.ttft_s * 1e3 : 0);
    j["e2el_ms"].push_back(ok ? q.e2el_s * 1e3 : 0);
    j["input_len"].push_back(q.prompt_tokens);
    j["output_len"].push_back(q.output_tokens);
    j["mode"].push_back(TransferModeName(q.mode));
    j["code"].push_back(absl::StatusCodeToString(q.code));
    j["target"].push_back(q.consumer);
    j["producer_cached_tokens"].push_back(q.producer_cached);
    j["consumer_cached_tokens"].push_back(q.consumer_cached);
  }
  return j;
}

}  // namespace

std::string SimulateJson(const ClusterSimResult& r, const SimWorkload& w, bool per_request) {
  std::vector<double> ttft, tpot, e2el;
  std::map<std::string, int64_t> modes, failures;
  int64_t good = 0, output_tokens = 0, moves = 0, fallbacks = 0;
  for (const SimRequestResult& q : r.requests) {
    moves += q.moves;
    fallbacks += q.fell_back ? 1 : 0;
    if (q.code != absl::StatusCode::kOk) {
      ++failures[absl::StatusCodeToString(q.code)];
      continue;
    }
    ++modes[TransferModeName(q.mode)];
    ttft.push_back(q.ttft_s);
    e2el.push_back(q.e2el_s);
    if (q.output_tokens > 1) tpot.push_back(q.tpot_s());
    output_tokens += q.output_tokens;
    good += MeetsSlo(w, q.ttft_s, q.tpot_s()) ? 1 : 0;
  }
  const std::vector<double> at = {50, 90, 99};
  const double seconds = w.duration_s;  // goodput per second of offered load
  nlohmann::json nodes = nlohmann::json::array();
  for (const SimNodeUse& n : r.nodes) {
    nodes.push_back({{"name", n.name},
                     {"role", n.producer ? "producer" : "consumer"},
                     {"busy", r.simulated_s > 0 ? n.busy_s / r.simulated_s : 0},
                     {"link", r.simulated_s > 0 ? n.link_s / r.simulated_s : 0},
                     {"steps", n.steps},
                     {"served", n.served}});
    // Utilisation and link occupancy over time: each bin's share, to the run's last bin.
    const auto bins = static_cast<size_t>(std::ceil(r.simulated_s / SimTimelineBin(w.duration_s)));
    auto shares = [bins](const SimTimeline& t) {
      nlohmann::json a = nlohmann::json::array();
      for (size_t i = 0; i < bins; ++i)
        a.push_back(i < t.seconds.size() ? t.seconds[i] / t.bin_s : 0.0);
      return a;
    };
    nodes.back()["busy_over_time"] = shares(n.busy_over_time);
    if (n.producer) nodes.back()["link_over_time"] = shares(n.link_over_time);
    if (per_request && !n.producer) nodes.back()["step_log"] = n.step_log;
  }
  nlohmann::json j = {{"requests", r.requests.size()},
                      {"completed", ttft.size()},
                      {"failed", r.requests.size() - ttft.size()},
                      {"failures_by_code", failures},
                      {"modes", modes},
                      {"moves", moves},          // streams moved off a node lost
                      {"fallbacks", fallbacks},  // transfers failed into local prefill
                      {"good", good},
                      {"goodput", static_cast<double>(good) / seconds},
                      {"request_throughput", static_cast<double>(ttft.size()) / seconds},
                      {"output_throughput", static_cast<double>(output_tokens) / seconds},
                      {"ttft", SummaryJson(Summarize(ttft, at))},
                      {"tpot", SummaryJson(Summarize(tpot, at))},
                      {"e2el", SummaryJson(Summarize(e2el, at))},
                      {"simulated_s", r.simulated_s},
                      {"timeline_bin_s", SimTimelineBin(w.duration_s)},
                      {"events", r.events},
                      {"nodes", nodes}};
  if (per_request) j["per_stream"] = PerStreamJson(r);
  return j.dump(1);
}

CLI::App* AddSimulateCommand(CLI::App& app, SimulateFlags* f) {
  CLI::App* s = app.add_subcommand(
      "simulate",
      "a deployment under a workload on simulated time, the daemons' own routing, "
      "admission and scheduling charged measured node profiles");
  s->add_option("--deployment", f->deployment, "the deployment TOML (bench/sim_config.h)")
      ->required();
  s->add_option("--workload", f->workload, "the workload TOML")->required();
  s->add_option("--out", f->out, "write the JSON here too");
  s->add_option("--drain", f->drain_s, "seconds after the last arrival before what runs is ended")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  s->add_option("--seed", f->seed, "the workload's seed instead of its file's")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 53));
  s->add_flag("--per-request", f->per_request, "each request's figures too (per_stream)");
  return s;
}

absl::Status RunSimulateCommand(const SimulateFlags& f) {
  SCD_ASSIGN_OR_RETURN(const SimDeployment deployment, ReadSimDeployment(f.deployment));
  SCD_ASSIGN_OR_RETURN(SimWorkload workload, ReadSimWorkload(f.workload));
  if (f.seed >= 0) workload.seed = static_cast<uint64_t>(f.seed);
  SCD_ASSIGN_OR_RETURN(const ClusterSimResult r, RunClusterSim(deployment, workload, f.drain_s));
  const std::string json = SimulateJson(r, workload, f.per_request);
  std::printf("%s\n", json.c_str());
  std::fflush(stdout);  // the JSON before the line on stderr
  std::fprintf(stderr,
               "scd-bench simulate: %zu requests, %ld events, %.1f simulated s in %.2f s "
               "(%.2f us per event)\n",
               r.requests.size(), r.events, r.simulated_s, r.wall_s,
               r.events > 0 ? r.wall_s * 1e6 / static_cast<double>(r.events) : 0.0);
  if (!f.out.empty()) SCD_RETURN_IF_ERROR(WriteStringToFile(f.out, json + "\n"));
  return absl::OkStatus();
}

}  // namespace scd::bench
