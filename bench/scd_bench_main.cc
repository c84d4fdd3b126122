// scd-bench: the benchmark harness (bench/README.md).
//   scd-bench serve --server HOST:PORT --targets xs[,b] [--mode M] [--request-rate 1,2,inf]
//                   [--burstiness B] [--max-concurrency C] [--num-prompts N]
//                   [--prompts FILE | --input-len T [--shared-prefix-len P [--prefix-seed S]]
//                    [--vocab-size V]] [--cache-salt SALT]
//                   [--node-stats HOST:PORT ... --cluster-secret-file FILE]
//                   [--output-len M] [--metric-percentiles 50,90,99]
//                   [--goodput ttft:MS tpot:MS e2el:MS] [--out DIR]
//     A load after `vllm bench serve`: the table on stdout per rate; with --out, serve-<rate>.json
//     per rate (totals and per-request arrays) and, for several rates, serve.png (TTFT and TPOT
//     against the request rate, bench/plot_serve.py).
//   scd-bench sweep (--producer DIR|CONFIG --consumer NAME=DIR|CONFIG[:ARTIFACT] ... [--layers N]
//                    | --server HOST:PORT --control HOST:PORT --cluster-secret-file FILE
//                      --consumer NAME ...)
//                   [--bandwidths 0.01,0.1,1,10,100,inf] [--latency-us U]
//                   [--modes local,raw,int4,recompute,reuse,scd,auto,auto-keep] [--max-kl K]
//                   [--ttft-slo-ms MS] [--bandwidth-trace FILE [--trace-hold S] [--judge-ttft-ms
//                   MS]
//                   [--trace-unannounced] [--trace-paired]]
//                   [--prompts FILE [--prompt-words W] | --prompt-len T [--vocab-size V]]
//                   [--num-prompts N]
//                   [--max-tokens M] [--compute-scale GPU_TOKENS_PER_S] --out DIR
//     TTFT and its breakdown against link bandwidth per mode, the bound, quality
//     (bench/bandwidth_sweep.h): results.jsonl, summary.csv and the plots (bench/plot_sweep.py).
//     With --producer it starts `scd serve --all-in-one` itself (a config.json: dummy weights,
//     timings only, "no fidelity"). --bandwidth-trace replays a rate trace for every mode
//     instead (bench/bandwidth_trace.h): trace.jsonl, trace.csv, trace.png.
//   scd-bench mixed --server HOST:PORT --target NAME [--decoders 8] [--decode-mode M]
//                   [--decode-prompt-len 64] [--decode-tokens 400] [--long-mode local|scd|...]
//                   [--long-prompt-len 2048] [--vocab-size V] [--out DIR]
//     A long prompt arriving beside running decodes (bench/mixed_load.h): the decoders' ITL p50
//     before it, p50 / p99 / max while it is prefilled or rebuilt; with --out, mixed.json.
//   scd-bench soak --out DIR [--duration S | --smoke] [--rate R] [--fault-gap S] [--seed N]
//                  [--transport grpc|ucx] [--shared-dir DIR]
//     Real daemons under a mixed load and a fault schedule (bench/soak.h): soak.json, soak.png,
//     the verdict (exit 1 when it fails).
//   scd-bench kills --out DIR [--kills 50] [--max-tokens 256] [--transport grpc|ucx]
//     A consumer killed mid-decode with another replica alive, again and again
//     (bench/kill_bench.h): each stream's move gap, its tokens against the unfaulted run,
//     kills.json.
//   scd-bench ucx-kills --out DIR [--rounds 100] [--config backend|ucx-defaults]
//                       [--stop-after-aborts N] [--chunk-mib 16] [--tls tcp] [--max-delay-ms 300]
//     Two UCX peers streaming to each other, one killed or closed mid-transfer, round after round
//     (bench/ucx_kill_stress.h): how often the survivor aborted, hung or failed; ucx_kills.json.
// Errors: one line on stderr, exit status 1.
#include <signal.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/file_util.h"
#include "base/plot_script.h"
#include "base/progress.h"
#include "base/status_macros.h"
#include "bench/bandwidth_sweep.h"
#include "bench/bandwidth_trace.h"
#include "bench/kill_command.h"
#include "bench/mixed_load.h"
#include "bench/netns_link.h"
#include "bench/plan_command.h"
#include "bench/profile_command.h"
#include "bench/serve_benchmark.h"
#include "bench/simulate_command.h"
#include "bench/soak_command.h"
#include "bench/sweep_deployment.h"
#include "bench/ucx_kill_command.h"
#include "bench/validate_command.h"
#include "proto/wire_mode.h"

namespace scd::bench {
namespace {

namespace fs = std::filesystem;

struct ServeFlags {
  ServeBenchOptions options;
  std::string targets;
  std::string rates = "inf";
  std::string prompts_file;
  int num_prompts = 100;
  int input_len = 128;
  int shared_prefix_len = 0;
  std::optional<uint64_t> prefix_seed;
  int vocab_size = 512;
  std::string secret_file;
  std::string percentiles = "50,90,99";
  std::vector<std::string> goodput;
  std::string out;
  bool quiet = false;
};

absl::StatusOr<std::vector<double>> ParseList(const std::string& flag, const std::string& text) {
  std::vector<double> values;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    double v = 0;
    if (item == "inf") {
      v = INFINITY;
    } else if (!absl::SimpleAtod(item, &v) || !(v > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": '", std::string(item), "' is not a positive number or inf"));
    }
    values.push_back(v);
  }
  if (values.empty()) return absl::InvalidArgumentError(absl::StrCat(flag, ": no values"));
  return values;
}

// The cluster secret from a file, else $SCD_CLUSTER_SECRET; `why` names the flag needing it.
absl::StatusOr<std::string> ClusterSecret(const std::string& file, const std::string& why) {
  std::string secret;
  std::ifstream in(file);
  if (!file.empty() && in >> secret) return secret;
  if (!file.empty()) return absl::NotFoundError(absl::StrCat("cannot read ", file));
  const char* env = std::getenv("SCD_CLUSTER_SECRET");
  if (env == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        why, " needs the cluster secret: --cluster-secret-file FILE or $SCD_CLUSTER_SECRET"));
  }
  return std::string(env);
}

absl::Status RunServe(ServeFlags& flags) {
  ServeBenchOptions& o = flags.options;
  o.targets = absl::StrSplit(flags.targets, ',', absl::SkipEmpty());
  SCD_ASSIGN_OR_RETURN(std::vector<double> rates, ParseList("--request-rate", flags.rates));
  SCD_ASSIGN_OR_RETURN(o.percentiles, ParseList("--metric-percentiles", flags.percentiles));
  for (double p : o.percentiles) {
    if (p > 100) return absl::InvalidArgumentError("--metric-percentiles: at most 100");
  }
  SCD_ASSIGN_OR_RETURN(o.goodput, ParseGoodput(flags.goodput));
  if (!flags.prompts_file.empty()) {
    SCD_ASSIGN_OR_RETURN(o.prompts, PromptsFromFile(flags.prompts_file, flags.num_prompts));
  } else {
    if (flags.input_len < flags.shared_prefix_len) {
      return absl::InvalidArgumentError(
          absl::StrCat("--input-len ", flags.input_len, " is below --shared-prefix-len ",
                       flags.shared_prefix_len, " (it counts the whole prompt, prefix included)"));
    }
    o.prompts = RandomPrompts(flags.num_prompts, flags.input_len, flags.shared_prefix_len,
                              flags.vocab_size, o.seed, flags.prefix_seed.value_or(o.seed));
  }
  if (!o.node_stats.empty()) {
    SCD_ASSIGN_OR_RETURN(o.secret, ClusterSecret(flags.secret_file, "--node-stats"));
  }
  if (!flags.out.empty()) fs::create_directories(flags.out);
  std::vector<std::string> written;
  for (double rate : rates) {
    o.request_rate = rate;
    Progress progress(absl::StrCat("rate ", RateText(rate)), static_cast<int64_t>(o.prompts.size()),
                      !flags.quiet);
    o.on_progress = [&](int, int) { progress.Advance(); };
    SCD_ASSIGN_OR_RETURN(ServeBenchResult result, RunServeBenchmark(o));
    progress.Done();
    std::fputs(ServeBenchTable(result).c_str(), stdout);
    std::fflush(stdout);
    if (!flags.out.empty()) {
      const std::string path = absl::StrCat(flags.out, "/serve-", RateText(rate), ".json");
      std::ofstream(path) << ServeBenchJson(result, o) << "\n";
      written.push_back(path);
    }
  }
  if (!flags.out.empty() && written.size() > 1) {
    std::vector<std::string> args = {"--out", flags.out + "/serve.png"};
    args.insert(args.end(), written.begin(), written.end());
    SCD_RETURN_IF_ERROR(RunPlotScript("plot_serve.py", args));
    std::fprintf(stderr, "scd-bench: wrote %s/serve.png\n", flags.out.c_str());
  }
  return absl::OkStatus();
}

struct SweepFlags {
  SweepOptions options;
  std::string producer;                // start an all-in-one server with these
  std::vector<std::string> consumers;  // NAME=DIR|CONFIG[:ARTIFACT], or NAME with --server
  int64_t layers = 0;
  std::string secret_file;
  std::string bandwidths = "0.01,0.1,1,10,100,inf";
  std::string modes = "local,raw,int4,recompute,reuse,scd";
  std::string prompts_file;
  int prompt_words = 0;
  int prompt_len = 0;
  int num_prompts = 2;
  int vocab_size = 0;  // 0: the config's (dummy) or 512
  uint64_t seed = 0;
  double compute_scale = 0;
  std::string links = "shaper";
  std::string bandwidth_trace;  // a file: replay it instead of the bandwidth grid
  double trace_hold_s = 5;
  std::string producer_cpus, consumer_cpus;
  std::string out;
  bool quiet = false;
};

// The directory this binary lives in (scd sits beside it in a build).
std::string SelfDir() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? "." : self.parent_path().string();
}

// SweepOptions::on_progress drawing `bar` (made at the first call) on stderr, unless quiet.
std::function<void(int, int, const std::string&)> ProgressTo(bool quiet, const char* name,
                                                             std::unique_ptr<Progress>* bar) {
  return [quiet, name, bar](int done, int total, const std::string& what) {
    if (quiet) return;
    if (!*bar) *bar = std::make_unique<Progress>(name, total);
    if (done > 0) (*bar)->Advance();
    (*bar)->SetDetail(what);
  };
}

// The sweep with a progress bar on stderr.
absl::StatusOr<SweepResult> RunSweepWithProgress(const SweepFlags& flags, SweepOptions o) {
  std::unique_ptr<Progress> bar;
  o.on_progress = ProgressTo(flags.quiet, "sweep", &bar);
  SCD_ASSIGN_OR_RETURN(SweepResult result, RunBandwidthSweep(o));
  if (bar) bar->Done();
  return result;
}

// One link's records into `out`: results.jsonl, summary.csv, sweep.json and the plots.
absl::Status WriteSweep(const SweepFlags& flags, const SweepOptions& o, const SweepResult& result,
                        const std::string& link, const std::string& out) {
  fs::create_directories(out);
  std::ofstream(out + "/results.jsonl") << SweepJsonl(result);
  std::ofstream(out + "/summary.csv") << SweepSummaryCsv(result);
  std::ofstream(out + "/sweep.json")
      << "{\"fidelity\": " << (o.fidelity ? "true" : "false")
      << ", \"prefill_tokens_per_s\": " << result.prefill_tokens_per_s
      << ", \"compute_scale_tokens_per_s\": " << flags.compute_scale
      << ", \"latency_us\": " << o.latency_us << ", \"link\": \"" << link << "\"}\n";
  return RunPlotScript("plot_sweep.py", {out});
}

// --bandwidth-trace: every mode over the trace; trace.jsonl, trace.csv and trace.png.
absl::Status RunTrace(const SweepFlags& flags, SweepOptions o) {
  SCD_ASSIGN_OR_RETURN(std::string text, ReadFileToString(flags.bandwidth_trace));
  absl::StatusOr<std::vector<TraceStep>> trace = ParseBandwidthTrace(text);
  if (!trace.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--bandwidth-trace ", flags.bandwidth_trace, ": ", trace.status().message()));
  }
  std::unique_ptr<Progress> bar;
  o.on_progress = ProgressTo(flags.quiet, "trace", &bar);
  SCD_ASSIGN_OR_RETURN(std::vector<TraceRecord> records,
                       RunBandwidthTrace(o, *trace, flags.trace_hold_s));
  if (bar) bar->Done();
  std::ofstream(flags.out + "/trace.jsonl") << TraceJsonl(records);
  const std::string csv = TraceSummaryCsv(records, *trace);
  std::ofstream(flags.out + "/trace.csv") << csv;
  std::fputs(csv.c_str(), stdout);
  if (o.trace_paired) {
    const std::string pairs = TracePairsCsv(records);
    std::ofstream(flags.out + "/trace_pairs.csv") << pairs;
    std::fputs(pairs.c_str(), stdout);
  }
  return RunPlotScript("plot_trace.py", {flags.out});
}

absl::Status RunSweep(SweepFlags& flags) {
  SweepOptions& o = flags.options;
  SCD_ASSIGN_OR_RETURN(o.bandwidths_gbps, ParseList("--bandwidths", flags.bandwidths));
  o.modes = absl::StrSplit(flags.modes, ',', absl::SkipEmpty());
  SCD_RETURN_IF_ERROR(ValidateSweepModes(o.modes));
  const std::vector<std::string> links = absl::StrSplit(flags.links, ',', absl::SkipEmpty());
  bool netns = false;
  for (const std::string& link : links) {
    if (link != "shaper" && link != "netns") {
      return absl::InvalidArgumentError(
          absl::StrCat("--link: '", link, "' is none of shaper, netns (or both: shaper,netns)"));
    }
    netns = netns || link == "netns";
  }
  if (links.empty()) return absl::InvalidArgumentError("--link: none given");
  if (flags.producer.empty() && (o.server.empty() || o.control.empty())) {
    return absl::InvalidArgumentError(
        "give --producer and --consumer NAME=PATH (a server started here), or --server, "
        "--control and --consumer NAME (a running deployment)");
  }
  if (!flags.bandwidth_trace.empty() && netns) {
    return absl::InvalidArgumentError(
        "--bandwidth-trace replays through the producers' shapers: --link shaper only");
  }
  if (o.trace_paired &&
      (flags.bandwidth_trace.empty() ||
       std::find(o.modes.begin(), o.modes.end(), "auto") == o.modes.end())) {
    return absl::InvalidArgumentError(
        "--trace-paired replays auto's requests over the trace: give --bandwidth-trace and "
        "--modes with auto");
  }
  if (netns && flags.producer.empty()) {
    return absl::InvalidArgumentError("--link netns starts its own nodes: give --producer");
  }
  if (!flags.producer_cpus.empty() && flags.producer.empty()) {
    return absl::InvalidArgumentError("--producer-cpus pins nodes it starts: give --producer");
  }
  if (flags.prompts_file.empty() && flags.prompt_len <= 0) {
    return absl::InvalidArgumentError("give --prompts FILE or --prompt-len T");
  }
  fs::create_directories(flags.out);
  if (!flags.prompts_file.empty()) {
    SCD_ASSIGN_OR_RETURN(
        o.prompts, PromptsFromFile(flags.prompts_file, flags.num_prompts, flags.prompt_words));
  } else {
    o.prompts = RandomPrompts(flags.num_prompts, flags.prompt_len, 0,
                              flags.vocab_size > 0 ? flags.vocab_size : 512, flags.seed, flags.seed);
  }
  std::unique_ptr<SweepDeployment> deployment;
  if (!flags.producer.empty()) {
    DeploymentSpec spec{SelfDir(),           flags.producer,       flags.consumers,
                        flags.layers,        flags.out + "/nodes", netns,
                        flags.producer_cpus, flags.consumer_cpus};
    SCD_ASSIGN_OR_RETURN(deployment, SweepDeployment::Start(spec));
    o.server = deployment->server();
    o.control = deployment->control();
    o.secret = deployment->secret();
    o.consumers = deployment->consumer_names();
    o.fidelity = deployment->fidelity();
  } else {
    o.consumers = flags.consumers;
    SCD_ASSIGN_OR_RETURN(o.secret, ClusterSecret(flags.secret_file, "--control"));
  }
  if (!flags.bandwidth_trace.empty()) {
    SCD_RETURN_IF_ERROR(RunTrace(flags, o));
    deployment.reset();
    std::fprintf(stderr, "scd-bench: wrote %s\n", flags.out.c_str());
    return absl::OkStatus();
  }
  o.links.clear();
  for (const std::string& link : links) {
    SweepOptions::Link control{link, nullptr};
    if (link == "netns") {
      NetnsLink* n = deployment->netns();
      control.set = [n](double gbps, double latency_us) { return n->Shape(gbps, latency_us); };
    }
    o.links.push_back(std::move(control));
  }
  // One sweep, every cell over each link in turn; then each link's records on their own.
  SCD_ASSIGN_OR_RETURN(SweepResult all, RunSweepWithProgress(flags, o));
  std::map<std::string, SweepResult> results;
  for (const std::string& link : links) {
    SweepResult& r = results[link];
    r.prefill_tokens_per_s = all.prefill_tokens_per_s;
    for (const SweepRecord& rec : all.records) {
      if (rec.link == link) r.records.push_back(rec);
    }
    const std::string out = links.size() > 1 ? flags.out + "/" + link : flags.out;
    SCD_RETURN_IF_ERROR(WriteSweep(flags, o, r, link, out));
    std::fputs(SweepSummaryCsv(r).c_str(), stdout);
  }
  if (results.count("shaper") && results.count("netns")) {
    const std::string csv = LinkComparisonCsv(results["shaper"], results["netns"]);
    std::ofstream(flags.out + "/link_comparison.csv") << csv;
    std::fputs(csv.c_str(), stdout);
  }
  deployment.reset();  // nodes stopped, namespaces removed
  std::fprintf(stderr, "scd-bench: wrote %s\n", flags.out.c_str());
  return absl::OkStatus();
}

absl::Status RunMixed(const MixedLoadOptions& options, const std::string& out) {
  SCD_ASSIGN_OR_RETURN(MixedLoadResult r, RunMixedLoad(options));
  std::printf("%d decoders (%s, %d-token prompts) while a %d-token prompt arrives (%s)\n",
              options.decoders, options.decode_mode.c_str(), options.decode_prompt_len,
              options.long_prompt_len, RanModeName(r.long_finished).c_str());
  std::printf("  ITL p50 before it:           %9.2f ms (%lld gaps)\n", r.itl_p50_baseline_ms,
              static_cast<long long>(r.baseline_gaps));
  std::printf("  ITL p50 / p99 / max while it is prefilled or rebuilt: %.2f / %.2f / %.2f ms "
              "(%lld gaps over %.0f ms)\n",
              r.itl_p50_during_ms, r.itl_p99_during_ms, r.itl_max_during_ms,
              static_cast<long long>(r.during_gaps), r.window_ms);
  std::printf("  p99 during / p50 before:     %9.2f\n", r.ratio());
  std::printf("  the long request's TTFT:     %9.1f ms; decoders ended well: %d of %d; window "
              "covered: %s\n",
              r.long_ttft_ms, r.decoders_ok, options.decoders, r.window_covered ? "yes" : "no");
  if (!r.error.empty()) std::printf("  failure: %s\n", r.error.c_str());
  if (!out.empty()) {
    std::filesystem::create_directories(out);
    std::ofstream(out + "/mixed.json") << MixedLoadJson(options, r) << "\n";
  }
  if (!r.error.empty()) return absl::InternalError(r.error);
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  CLI::App app{"scd-bench: serving load and bandwidth-sweep benchmarks"};
  app.require_subcommand(1);
  ServeFlags serve;
  CLI::App* s =
      app.add_subcommand("serve", "a request load on a running server (vllm bench serve)");
  s->add_option("--server", serve.options.server, "coordinator or all-in-one server (host:port)")
      ->required();
  s->add_option("--targets", serve.targets, "consumer model names, comma-separated (fan-out)")
      ->required();
  s->add_option("--mode", serve.options.mode, "transfer mode (default: auto)");
  s->add_option("--request-rate", serve.rates,
                "requests/s, comma-separated (one run each; inf: all at once)")
      ->capture_default_str();
  s->add_option("--burstiness", serve.options.burstiness,
                "gamma shape of the arrival gaps: 1 Poisson, < 1 burstier")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  s->add_option("--max-concurrency", serve.options.max_concurrency,
                "requests in flight at most (0: unbounded)")
      ->check(CLI::NonNegativeNumber);
  s->add_option("--num-prompts", serve.num_prompts, "requests per run")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  CLI::Option* file = s->add_option("--prompts", serve.prompts_file,
                                    "text prompts, one per line (else random token ids)");
  s->add_option("--input-len", serve.input_len,
                "random prompts: ids per prompt, the shared prefix included")
      ->check(CLI::Range(1, 1 << 20))
      ->excludes(file)
      ->capture_default_str();
  s->add_option("--shared-prefix-len", serve.shared_prefix_len,
                "random prompts: ids every prompt starts with (SGLang's generated shared prefix)")
      ->check(CLI::Range(0, 1 << 20))
      ->excludes(file);
  s->add_option("--prefix-seed", serve.prefix_seed,
                "random prompts: the shared prefix's seed (default --seed; runs with the same "
                "prefix seed share the prefix, their own ids differ with --seed)")
      ->excludes(file);
  s->add_option("--cache-salt", serve.options.cache_salt,
                "every request's cache_salt, or a comma-separated list taken in turn (tenants; "
                "requests with different salts never share cached "
                "prefixes)");
  s->add_option("--ttft-slo-ms", serve.options.ttft_slo_ms,
                "every request's ttft_slo_ms: auto's objective, the best quality predicted to "
                "meet it (with --mode auto; 0: none)")
      ->check(CLI::Range(0, 3600000));
  s->add_option("--node-stats", serve.options.node_stats,
                "a node's control address (producer, consumer or coordinator): its prefill "
                "tokens and prefix-cache counters over each run (repeatable)");
  s->add_option("--cluster-secret-file", serve.secret_file,
                "the cluster secret for --node-stats (default: $SCD_CLUSTER_SECRET)");
  s->add_option("--vocab-size", serve.vocab_size,
                "random prompts: ids are drawn from [3, V) (the served models' vocabulary)")
      ->check(CLI::Range(4, 1 << 24))
      ->excludes(file)
      ->capture_default_str();
  s->add_option("--output-len", serve.options.output_len, "max_tokens of every request")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  s->add_option("--seed", serve.options.seed, "prompts and arrival times");
  s->add_option("--metric-percentiles", serve.percentiles, "comma-separated")
      ->capture_default_str();
  s->add_option("--goodput", serve.goodput, "SLOs: ttft:MS tpot:MS e2el:MS (any subset)");
  s->add_option("--out", serve.out, "write serve-<rate>.json (and serve.png) here");
  s->add_flag("--quiet", serve.quiet, "no progress bar");

  SweepFlags sweep;
  CLI::App* w = app.add_subcommand("sweep", "TTFT and quality against link bandwidth, per mode");
  w->add_option("--producer", sweep.producer,
                "start an all-in-one server: the producer's model directory or config.json");
  w->add_option("--consumer", sweep.consumers,
                "NAME=DIR|CONFIG[:ARTIFACT] (with --producer) or NAME (with --server); repeatable")
      ->required();
  w->add_option("--layers", sweep.layers, "dummy weights: keep the first N layers")
      ->check(CLI::NonNegativeNumber);
  w->add_option("--server", sweep.options.server, "a running deployment's public API");
  w->add_option("--control", sweep.options.control, "its coordinator's control address");
  w->add_option("--cluster-secret-file", sweep.secret_file,
                "the cluster secret (default: $SCD_CLUSTER_SECRET)");
  w->add_option("--bandwidths", sweep.bandwidths, "Gbit/s, comma-separated (inf: unshaped)")
      ->capture_default_str();
  w->add_option("--latency-us", sweep.options.latency_us, "one-way latency of the link")
      ->check(CLI::Range(0.0, 1e7));
  w->add_option("--modes", sweep.modes, "comma-separated; auto: the coordinator chooses")
      ->capture_default_str();
  w->add_option("--bandwidth-trace", sweep.bandwidth_trace,
                "replay this trace (lines \"SECONDS GBPS\") for every mode instead of the "
                "bandwidth grid: TTFT against time (trace.csv, trace.png)")
      ->check(CLI::ExistingFile);
  w->add_option("--trace-hold", sweep.trace_hold_s, "seconds the trace's last rate holds")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  w->add_option("--max-kl", sweep.options.max_kl,
                "auto's quality budget (0: the artifact's recommended point's KL)")
      ->check(CLI::Range(0.0, 10.0));
  w->add_option("--ttft-slo-ms", sweep.options.ttft_slo_ms,
                "auto's TTFT objective: the best quality predicted to meet it (0: none)")
      ->check(CLI::Range(0, 3600 * 1000));
  w->add_option("--judge-ttft-ms", sweep.options.judge_ttft_ms,
                "with --bandwidth-trace: count requests within this TTFT (met_slo) without "
                "sending it as an objective (0: --ttft-slo-ms)")
      ->check(CLI::Range(0.0, 3600.0 * 1000));
  w->add_flag("--trace-unannounced", sweep.options.trace_unannounced,
              "with --bandwidth-trace: steps after the first shape the link without the "
              "coordinator planning with them (it learns the rate from completed transfers)");
  w->add_flag("--trace-paired", sweep.options.trace_paired,
              "with --bandwidth-trace and --modes auto: replay each of auto's requests at the "
              "same instant of the trace with its choice kept at its ranks (no adaptation); "
              "trace_pairs.csv compares the two");
  CLI::Option* wfile = w->add_option("--prompts", sweep.prompts_file, "prompts, one per line");
  w->add_option("--prompt-words", sweep.prompt_words,
                "with --prompts: cut the file's text into prompts of W words instead")
      ->check(CLI::Range(1, 1 << 20))
      ->needs(wfile);
  w->add_option("--prompt-len", sweep.prompt_len, "random-id prompts of T tokens")
      ->check(CLI::Range(2, 1 << 20))
      ->excludes(wfile);
  w->add_option("--vocab-size", sweep.vocab_size, "random ids from [3, V) (default 512)")
      ->check(CLI::Range(4, 1 << 24))
      ->excludes(wfile);
  w->add_option("--num-prompts", sweep.num_prompts, "prompts per cell")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  w->add_option("--max-tokens", sweep.options.max_tokens, "tokens per request (>= 32: agreement)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  w->add_option("--seed", sweep.seed, "random prompts");
  w->add_option("--compute-scale", sweep.compute_scale,
                "a GPU's prefill speed (tokens/s): adds a second x axis, bandwidth x that / the "
                "prefill speed measured here")
      ->check(CLI::NonNegativeNumber);
  w->add_option("--link", sweep.links,
                "shaper (the producer's token bucket), netns (daemons in two network namespaces "
                "on a tc-shaped veth; root), or shaper,netns (both, compared)")
      ->capture_default_str();
  CLI::Option* pcpus =
      w->add_option("--producer-cpus", sweep.producer_cpus,
                    "start separate daemons, the producer pinned to these CPUs (as 0 or 0-3) with "
                    "as many compute threads");
  CLI::Option* ccpus = w->add_option("--consumer-cpus", sweep.consumer_cpus,
                                     "... and the coordinator and consumers to these");
  pcpus->needs(ccpus);
  ccpus->needs(pcpus);
  w->add_option("--out", sweep.out, "output directory")->required();
  w->add_flag("--quiet", sweep.quiet, "no progress bar");

  MixedLoadOptions mixed;
  std::string mixed_out;
  CLI::App* m = app.add_subcommand(
      "mixed", "a long prompt arriving beside running decodes: their inter-token latency");
  m->add_option("--server", mixed.server, "coordinator or all-in-one server")->required();
  m->add_option("--target", mixed.target, "the consumer")->required();
  m->add_option("--decoders", mixed.decoders, "streams decoding")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  m->add_option("--decode-mode", mixed.decode_mode, "their mode")->capture_default_str();
  m->add_option("--decode-prompt-len", mixed.decode_prompt_len, "their prompts' ids")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  m->add_option("--decode-tokens", mixed.decode_tokens,
                "their max_tokens (they must outlast the long prompt's prefill)")
      ->check(CLI::Range(2, 1 << 20))
      ->capture_default_str();
  m->add_option("--baseline-tokens", mixed.baseline_tokens,
                "tokens per decoder measured before the long prompt arrives")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  m->add_option("--long-mode", mixed.long_mode, "the long request's mode (local, scd, ...)")
      ->capture_default_str();
  m->add_option("--long-prompt-len", mixed.long_prompt_len, "the long prompt's ids")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  m->add_option("--vocab-size", mixed.vocab_size, "ids are drawn from [3, V)")
      ->check(CLI::Range(4, 1 << 24))
      ->capture_default_str();
  m->add_option("--seed", mixed.seed, "prompts");
  m->add_option("--out", mixed_out, "write mixed.json here");
  SoakFlags soak;
  CLI::App* k = AddSoakCommand(app, &soak);
  KillFlags kills;
  CLI::App* kill = AddKillCommand(app, &kills);
  UcxKillFlags ucx_kills;
  CLI::App* ucx_kill = AddUcxKillCommand(app, &ucx_kills);
  UcxKillPeerOptions ucx_peer;
  CLI::App* ucx_peer_command = AddUcxKillPeerCommand(app, &ucx_peer);
  ProfileOptions profile;
  CLI::App* profile_command = AddProfileCommand(app, &profile);
  SimulateFlags simulate;
  CLI::App* simulate_command = AddSimulateCommand(app, &simulate);
  ValidateOptions validate;
  CLI::App* validate_command = AddValidateCommand(app, &validate);
  PlanFlags plan;
  CLI::App* plan_command = AddPlanCommand(app, &plan);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  spdlog::set_default_logger(spdlog::stderr_color_mt("scd-bench"));
  if (ucx_peer_command->parsed()) return RunUcxKillPeer(ucx_peer);  // before any thread starts
  if (w->parsed()) {
    // SIGINT/SIGTERM: remove the namespaces a --link netns sweep made, then exit; the nodes go
    // with this process (base/child_process.h).
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
    std::thread([signals] {
      int signal = 0;
      sigwait(&signals, &signal);
      std::fprintf(stderr, "scd-bench: %s: stopping\n", signal == SIGINT ? "SIGINT" : "SIGTERM");
      NetnsLink::RemoveAllOf(static_cast<int>(getpid()));
      std::_Exit(128 + signal);
    }).detach();
  }
  absl::Status status = s->parsed()                  ? RunServe(serve)
                        : m->parsed()                ? RunMixed(mixed, mixed_out)
                        : k->parsed()                ? RunSoakCommand(soak)
                        : kill->parsed()             ? RunKillCommand(kills)
                        : ucx_kill->parsed()         ? RunUcxKillCommand(ucx_kills)
                        : profile_command->parsed()  ? RunProfileCommand(profile)
                        : simulate_command->parsed() ? RunSimulateCommand(simulate)
                        : validate_command->parsed() ? RunValidateCommand(validate)
                        : plan_command->parsed()     ? RunPlanCommand(plan)
                                                     : RunSweep(sweep);
  if (!status.ok()) {
    std::fprintf(stderr, "scd-bench: error: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace scd::bench

int main(int argc, char** argv) { return scd::bench::Main(argc, argv); }
