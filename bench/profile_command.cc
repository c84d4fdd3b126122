#include "bench/profile_command.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "base/file_util.h"
#include "base/shared_dir.h"
#include "base/status_macros.h"
#include "bench/model_shape.h"
#include "bench/serve_benchmark.h"
#include "bench/soak_deployment.h"

namespace scd::bench {
namespace {

namespace fs = std::filesystem;

// Rows of a consumer's batched step: scd-consumer's --max-batched-tokens, left at its default.
constexpr int64_t kDaemonStepRows = 512;

// The deployment and what every phase needs of it.
struct Bench {
  const ProfileOptions* o = nullptr;
  std::unique_ptr<SoakDeployment> deployment;
  std::string coordinator, producer_control, consumer_control;
  int producer_index = -1, consumer_index = -1;
  ModelShape config;  // the consumer's
  uint64_t next_seed = 0;
};

void Say(const Bench& b, const std::string& line) {
  if (b.o->progress) std::fprintf(stderr, "scd-bench profile: %s\n", line.c_str());
}

// One load of `prompts` in `mode`, at most `concurrency` at once; every request must finish.
// `rate`: requests/s, sent at even spacing; inf: each as the one before ends.
absl::StatusOr<ServeBenchResult> Serve(const Bench& b, const std::string& mode,
                                       std::vector<BenchPrompt> prompts, int concurrency,
                                       int output_len, double rate = INFINITY) {
  ServeBenchOptions s;
  s.server = b.coordinator;
  s.targets = {"profiled"};
  s.mode = mode;
  s.prompts = std::move(prompts);
  s.output_len = output_len;
  s.max_concurrency = concurrency;
  s.request_rate = rate;
  s.burstiness = 1e6;  // a gamma this steady is even spacing (coefficient of variation 0.1 %)
  s.timeout = absl::Seconds(300);
  s.node_stats = {b.producer_control, b.consumer_control};
  s.secret = b.deployment->secret();
  SCD_ASSIGN_OR_RETURN(ServeBenchResult r, RunServeBenchmark(s));
  for (const StreamRecord& stream : r.streams) {
    if (!stream.ok) {
      return absl::InternalError(absl::StrCat("a ", mode, " request of ", stream.prompt_tokens,
                                              " tokens failed (code ", stream.code,
                                              "): ", stream.error));
    }
  }
  return r;
}

PromptSample SampleOf(const v1::Finished& f) {
  PromptSample s;
  s.local = f.transfer_mode() == v1::TRANSFER_MODE_LOCAL;
  s.prompt_tokens = f.prompt_tokens();
  s.producer_cached = f.producer_cached_tokens();
  s.consumer_cached = f.consumer_cached_tokens();
  const v1::Timings& t = f.timings();
  s.prefill_us = static_cast<double>(t.prefill());
  s.encode_us = static_cast<double>(t.encode());
  s.rebuild_us = static_cast<double>(t.rebuild());
  s.first_decode_us = static_cast<double>(t.first_decode());
  s.transfer_us = static_cast<double>(t.transfer());
  s.server_ttft_us = static_cast<double>(t.ttft());
  s.payload_bytes = static_cast<int64_t>(f.payload_bytes());
  s.layers = t.layer_codes_size();
  if (s.layers > 0) {
    s.first_layer_out_us = static_cast<double>(t.layer_codes(0));
    s.last_layer_out_us = static_cast<double>(t.layer_codes(s.layers - 1));
  }
  return s;
}

// Phase 1: groups of three prompts sharing half their tokens, one request at a time.
absl::Status PromptPhase(Bench& b, const std::string& mode, ProfileReport* report) {
  std::vector<BenchPrompt> prompts;
  for (int len : b.o->prompt_lens) {
    for (int r = 0; r < b.o->repeats; ++r) {
      const uint64_t seed = b.o->seed * 1000003 + b.next_seed++;
      for (BenchPrompt& p : RandomPrompts(3, len, len / 2, static_cast<int>(b.config.vocab_size),
                                          seed, seed + 7777)) {
        prompts.push_back(std::move(p));
      }
    }
  }
  // Unmeasured first: one prompt of each length (a pass's first run at a shape allocates what
  // later ones reuse), each its own prefix.
  std::vector<BenchPrompt> warm;
  for (int len : b.o->prompt_lens) {
    const uint64_t seed = b.o->seed * 1000003 + b.next_seed++;
    warm.push_back(RandomPrompts(1, len, 0, static_cast<int>(b.config.vocab_size), seed, seed)[0]);
  }
  SCD_RETURN_IF_ERROR(Serve(b, mode, std::move(warm), 1, 2).status());
  Say(b, absl::StrCat(mode, ": ", prompts.size(), " prompts of ", b.o->prompt_lens.front(), " to ",
                      b.o->prompt_lens.back(), " tokens, one at a time"));
  SCD_ASSIGN_OR_RETURN(ServeBenchResult r, Serve(b, mode, std::move(prompts), 1, 2));
  for (const StreamRecord& stream : r.streams) {
    PromptSample s = SampleOf(stream.finished);
    s.client_ttft_us = stream.ttft_s * 1e6;
    if (!s.local) report->producer_sample_tokens += s.prompt_tokens - 1 - s.producer_cached;
    report->input.prompts.push_back(s);
  }
  for (const NodeStatsDelta& n : r.nodes) {
    if (n.role == "producer") report->producer_counted_tokens += n.prefill_tokens;
  }
  return absl::OkStatus();
}

// Phase 1b: a prompt of each length, each its own prefix, sent idle_gap_ms after the one before
// was sent (one at a time): the costs after the deployment sat idle (bench/profile_fit.h FitIdle).
absl::Status IdlePhase(Bench& b, const std::string& mode, ProfileReport* report) {
  std::vector<BenchPrompt> prompts;
  for (int r = 0; r < 2; ++r) {
    for (int len : b.o->prompt_lens) {
      const uint64_t seed = b.o->seed * 1000003 + b.next_seed++;
      prompts.push_back(
          RandomPrompts(1, len, 0, static_cast<int>(b.config.vocab_size), seed, seed)[0]);
    }
  }
  Say(b, absl::StrFormat("%s: %d prompts, one every %g ms (after idle)", mode, prompts.size(),
                         b.o->idle_gap_ms));
  SCD_ASSIGN_OR_RETURN(ServeBenchResult r,
                       Serve(b, mode, std::move(prompts), 1, 2, 1e3 / b.o->idle_gap_ms));
  // The first followed the last phase's requests at once; each later one the idle since the
  // one before ended.
  for (size_t i = 1; i < r.streams.size() && i < r.send_s.size(); ++i) {
    const double idle = r.send_s[i] - r.send_s[i - 1] - r.streams[i - 1].e2el_s;
    if (idle <= 0) continue;  // the one before was still running: not after idle
    PromptSample s = SampleOf(r.streams[i].finished);
    s.client_ttft_us = r.streams[i].ttft_s * 1e6;
    s.idle_us = idle * 1e6;
    report->input.prompts.push_back(s);
  }
  return absl::OkStatus();
}

// Phase 2: batches decoding together, at a short and a long prompt.
absl::Status StepPhase(Bench& b, ProfileReport* report) {
  const int longest = b.o->prompt_lens.back();
  for (int len : {std::min(32, longest), longest / 2, longest}) {
    for (int batch : b.o->batches) {
      const uint64_t seed = b.o->seed * 1000003 + b.next_seed++;
      std::vector<BenchPrompt> prompts =
          RandomPrompts(batch, len, 0, static_cast<int>(b.config.vocab_size), seed, seed);
      SCD_ASSIGN_OR_RETURN(ServeBenchResult r,
                           Serve(b, "local", std::move(prompts), batch, b.o->output_len));
      std::vector<std::vector<double>> gaps;
      for (const StreamRecord& stream : r.streams) gaps.push_back(stream.itl_s);
      const StepSample step = StepFromGaps(gaps, len);
      for (double r : StepRatios(gaps)) report->input.step_ratios.push_back(r);
      if (step.sequences > 0) report->input.steps.push_back(step);
      Say(b, absl::StrFormat("decode steps: %d at once, %d-token prompts: %.2f ms", batch, len,
                             step.step_us / 1e3));
    }
  }
  return absl::OkStatus();
}

// Phase 3: requests arriving while others decode (three at once, each replaced as it ends),
// local then scd; the consumer's own measures of what the prompt work cost the decodes.
absl::Status InterferencePhase(Bench& b, ProfileReport* report) {
  const int len = b.o->prompt_lens.back();
  for (const char* mode : {"local", "scd"}) {
    const uint64_t seed = b.o->seed * 1000003 + b.next_seed++;
    SCD_RETURN_IF_ERROR(
        Serve(b, mode, RandomPrompts(12, len, 0, static_cast<int>(b.config.vocab_size), seed, seed),
              3, b.o->output_len)
            .status());
  }
  SCD_ASSIGN_OR_RETURN(v1::NodeStats stats, b.deployment->Stats(b.consumer_index));
  ProfileFitInput& in = report->input;
  in.local_itl_us = stats.local_itl_us_per_token();
  in.rebuild_itl_us = stats.rebuild_itl_us_per_token();
  in.busy_prefill_us = stats.busy_prefill_us_per_token();
  in.kv_budget_bytes = static_cast<int64_t>(stats.kv_budget_bytes());
  in.capacity = stats.capacity();
  Say(b, absl::StrFormat("prompt work beside decodes: %.2f us/token local, %.2f us/token rebuilt,"
                         " a busy prefill %.1f us/token",
                         in.local_itl_us, in.rebuild_itl_us, in.busy_prefill_us));
  return absl::OkStatus();
}

absl::Status CheckOptions(ProfileOptions& o, const ModelShape& config) {
  if (o.producer_model.empty() || o.consumer_model.empty() || o.artifact.empty() || o.out.empty()) {
    return absl::InvalidArgumentError("profile needs both models, the artifact and --out");
  }
  if (!fs::exists(o.artifact)) return absl::NotFoundError("no artifact at " + o.artifact);
  const int most = static_cast<int>(config.max_position_embeddings) - o.output_len - 2;
  if (o.prompt_lens.empty()) {
    for (int len = 8; len <= most / 2; len *= 2) o.prompt_lens.push_back(len);
    if (o.prompt_lens.back() * 3 / 2 <= most / 2)
      o.prompt_lens.push_back(o.prompt_lens.back() * 3 / 2);
  }
  std::sort(o.prompt_lens.begin(), o.prompt_lens.end());
  if (o.prompt_lens.size() < 3 || o.prompt_lens.front() < 4 || o.prompt_lens.back() > most) {
    return absl::InvalidArgumentError(absl::StrCat(
        "profile needs at least 3 prompt lengths from 4 to ", most,
        " (the context less the output): a prefill's three terms are fitted from them"));
  }
  if (o.batches.size() < 2 || *std::min_element(o.batches.begin(), o.batches.end()) < 1) {
    return absl::InvalidArgumentError("profile needs at least 2 batch sizes, each >= 1");
  }
  if (o.output_len < 8 || o.repeats < 1) {
    return absl::InvalidArgumentError("profile needs --output-len >= 8 and --repeats >= 1");
  }
  return absl::OkStatus();
}

absl::Status StartDeployment(Bench& b) {
  const ProfileOptions& o = *b.o;
  SoakDeploymentSpec spec;
  spec.bin_dir = o.bin_dir;
  spec.dir = o.out + "/daemons";
  spec.producer_model = o.producer_model;
  spec.consumers = {{"profiled", o.consumer_model, o.artifact}};
  spec.coordinators = 1;
  spec.transport = o.transport;
  spec.producer_cpus = o.producer_cpus;
  spec.consumer_cpus = o.consumer_cpus;
  spec.cpu_period = absl::Milliseconds(o.quota_period_ms);
  Say(b, absl::StrFormat("starting the daemons (producer %g CPUs, consumer %g CPUs; logs in %s)",
                         o.producer_cpus, o.consumer_cpus, spec.dir));
  SCD_ASSIGN_OR_RETURN(b.deployment, SoakDeployment::Start(spec));
  for (int i = 0; i < b.deployment->size(); ++i) {
    const SoakNode node = b.deployment->Node(i);
    if (node.role == SoakRole::kCoordinator) b.coordinator = node.address;
    if (node.role == SoakRole::kProducer) b.producer_index = i;
    if (node.role == SoakRole::kProducer) b.producer_control = node.control_address;
    if (node.role == SoakRole::kConsumer) b.consumer_index = i;
    if (node.role == SoakRole::kConsumer) b.consumer_control = node.control_address;
  }
  return absl::OkStatus();
}

std::string MachineName(const ProfileOptions& o) {
  std::string model = "unknown CPU";
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  }
  return absl::StrFormat("%s, %ld cores, producer %g CPUs, consumer %g CPUs per %g ms", model,
                         sysconf(_SC_NPROCESSORS_ONLN), o.producer_cpus, o.consumer_cpus,
                         o.quota_period_ms);
}

}  // namespace

absl::StatusOr<ProfileReport> RunProfile(const ProfileOptions& options) {
  ProfileOptions o = options;
  SCD_ASSIGN_OR_RETURN(const ModelShape config, ReadModelShape(o.consumer_model));
  SCD_RETURN_IF_ERROR(CheckOptions(o, config));
  const absl::Time start = absl::Now();
  Bench b;
  b.o = &o;
  b.config = config;
  SCD_RETURN_IF_ERROR(StartDeployment(b));
  ProfileReport report;
  for (int run = 0; run < o.runs; ++run) {
    if (o.runs > 1) Say(b, absl::StrCat("run ", run + 1, " of ", o.runs));
    SCD_RETURN_IF_ERROR(PromptPhase(b, "local", &report));
    SCD_RETURN_IF_ERROR(PromptPhase(b, "scd", &report));
    if (o.idle_gap_ms > 0) {
      SCD_RETURN_IF_ERROR(IdlePhase(b, "local", &report));
      SCD_RETURN_IF_ERROR(IdlePhase(b, "scd", &report));
    }
    SCD_RETURN_IF_ERROR(StepPhase(b, &report));
  }
  SCD_RETURN_IF_ERROR(InterferencePhase(b, &report));
  for (int i : {b.producer_index, b.consumer_index}) {
    absl::StatusOr<CpuGroupStat> t = b.deployment->Throttling(i);
    if (t.ok()) report.throttling.emplace_back(b.deployment->Node(i).name, *t);
  }
  ProfileFitInput& in = report.input;
  in.producer_model = fs::path(o.producer_model).filename().string();
  in.consumer_model = fs::path(o.consumer_model).filename().string();
  in.machine = MachineName(o);
  in.producer_cpus = o.producer_cpus;
  in.consumer_cpus = o.consumer_cpus;
  in.kv_bytes_per_token = config.kv_bytes_per_token;
  in.step_rows = kDaemonStepRows;
  report.runs = o.runs;
  report.fit = FitProfiles(in);
  report.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return report;
}

std::string ProfileJson(const ProfileReport& r) {
  nlohmann::json prompts = nlohmann::json::array(), steps = nlohmann::json::array(),
                 fits = nlohmann::json::array(), throttling = nlohmann::json::array();
  for (const PromptSample& s : r.input.prompts) {
    prompts.push_back({{"mode", s.local ? "local" : "scd"},
                       {"prompt_tokens", s.prompt_tokens},
                       {"producer_cached", s.producer_cached},
                       {"consumer_cached", s.consumer_cached},
                       {"prefill_us", s.prefill_us},
                       {"encode_us", s.encode_us},
                       {"rebuild_us", s.rebuild_us},
                       {"first_decode_us", s.first_decode_us},
                       {"transfer_us", s.transfer_us},
                       {"payload_bytes", s.payload_bytes},
                       {"layers", s.layers},
                       {"first_layer_out_us", s.first_layer_out_us},
                       {"last_layer_out_us", s.last_layer_out_us},
                       {"client_ttft_us", s.client_ttft_us},
                       {"server_ttft_us", s.server_ttft_us},
                       {"idle_us", s.idle_us}});
  }
  for (const StepSample& s : r.input.steps) {
    steps.push_back(
        {{"sequences", s.sequences}, {"context_tokens", s.context_tokens}, {"step_us", s.step_us}});
  }
  const std::vector<FitReport> none;
  for (const FitReport& f : r.fit.ok() ? r.fit->fits : none) {
    fits.push_back({{"cost", f.cost},
                    {"samples", f.samples},
                    {"coefficients", f.fit.coefficients},
                    {"rms_residual_us", f.fit.rms_residual},
                    {"rms_relative_residual", f.fit.rms_relative_residual},
                    {"rms_cost_us", f.fit.rms_cost}});
  }
  for (const auto& [node, t] : r.throttling) {
    throttling.push_back({{"node", node},
                          {"periods", t.periods},
                          {"throttled", t.throttled},
                          {"throttled_s", absl::ToDoubleSeconds(t.throttled_time)}});
  }
  const nlohmann::json j = {{"machine", r.input.machine},
                            {"runs", r.runs},
                            {"seconds", r.seconds},
                            {"producer_counted_tokens", r.producer_counted_tokens},
                            {"producer_sample_tokens", r.producer_sample_tokens},
                            {"fit_error", r.fit.ok() ? "" : std::string(r.fit.status().message())},
                            {"producer", r.fit.ok() ? NodeProfileToml(r.fit->producer) : ""},
                            {"consumer", r.fit.ok() ? NodeProfileToml(r.fit->consumer) : ""},
                            {"local_itl_us", r.input.local_itl_us},
                            {"rebuild_itl_us", r.input.rebuild_itl_us},
                            {"busy_prefill_us", r.input.busy_prefill_us},
                            {"fits", fits},
                            {"throttling", throttling},
                            {"prompts", prompts},
                            {"steps", steps}};
  return j.dump(1);
}

CLI::App* AddProfileCommand(CLI::App& app, ProfileOptions* o) {
  CLI::App* p = app.add_subcommand(
      "profile",
      "a producer's and a consumer's costs, measured on real daemons under CPU quotas "
      "(node profiles for the cluster simulator)");
  p->add_option("--producer", o->producer_model, "the producer's model directory")->required();
  p->add_option("--consumer", o->consumer_model, "the consumer's model directory")->required();
  p->add_option("--artifact", o->artifact, "the producer -> consumer artifact (scd-calib fit)")
      ->required();
  p->add_option("--out", o->out, "producer.toml, consumer.toml, profile.json, the daemons' logs")
      ->required();
  p->add_option("--producer-cpus", o->producer_cpus, "the producer's CPU quota (0: unlimited)")
      ->check(CLI::Range(0.0, 1024.0))
      ->capture_default_str();
  p->add_option("--consumer-cpus", o->consumer_cpus, "the consumer's CPU quota (0: unlimited)")
      ->check(CLI::Range(0.0, 1024.0))
      ->capture_default_str();
  p->add_option("--quota-period-ms", o->quota_period_ms, "the CPU quotas' period")
      ->check(CLI::Range(1.0, 1000.0))
      ->capture_default_str();
  p->add_option("--transport", o->transport, "what codes travel over")
      ->check(CLI::IsMember({"grpc", "ucx"}))
      ->capture_default_str();
  p->add_option("--prompt-lens", o->prompt_lens,
                "prompt lengths of the prompt phase (default: 8, 16, ... to the context's half)")
      ->delimiter(',')
      ->check(CLI::Range(1, 1 << 20));
  p->add_option("--batches", o->batches, "batch sizes of the decode-step phase")
      ->delimiter(',')
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  p->add_option("--output-len", o->output_len, "tokens per request of the decode phases")
      ->check(CLI::Range(8, 1 << 16))
      ->capture_default_str();
  p->add_option("--repeats", o->repeats, "prompt groups per length and mode")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  p->add_option("--idle-gap-ms", o->idle_gap_ms,
                "spacing of the prompts measured after idle (0: none, no idle slowdown)")
      ->check(CLI::Range(0.0, 10000.0))
      ->capture_default_str();
  p->add_option("--runs", o->runs,
                "times the prompt and step phases run (each cost fitted to its shape's median)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  p->add_option("--seed", o->seed, "the prompts' draw")->capture_default_str();
  p->add_flag(
      "--quiet", [o](int64_t) { o->progress = false; }, "no progress lines");
  return p;
}

absl::Status RunProfileCommand(ProfileOptions o) {
  o.bin_dir = ExecutableDir();
  fs::create_directories(o.out);
  o.out = fs::absolute(o.out).string();
  SCD_ASSIGN_OR_RETURN(ProfileReport r, RunProfile(o));
  SCD_RETURN_IF_ERROR(WriteStringToFile(o.out + "/profile.json", ProfileJson(r) + "\n"));
  if (!r.fit.ok()) {
    return absl::Status(
        r.fit.status().code(),
        absl::StrCat(r.fit.status().message(), " (the samples: ", o.out, "/profile.json)"));
  }
  const std::string producer = o.out + "/producer.toml", consumer = o.out + "/consumer.toml";
  SCD_RETURN_IF_ERROR(WriteStringToFile(producer, NodeProfileToml(r.fit->producer)));
  SCD_RETURN_IF_ERROR(WriteStringToFile(consumer, NodeProfileToml(r.fit->consumer)));
  std::printf("%-22s %8s %12s  %s\n", "cost", "samples", "rms resid.", "coefficients (us)");
  for (const FitReport& f : r.fit->fits) {
    std::string coefficients;
    for (double c : f.fit.coefficients) absl::StrAppendFormat(&coefficients, " %.4g", c);
    std::printf("%-22s %8d %11.1f%%  %s\n", f.cost.c_str(), f.samples,
                100 * f.fit.rms_relative_residual, coefficients.c_str());
  }
  std::printf("client TTFT beyond the consumer's own (coordinator, hops): %.0f us (median)\n",
              r.fit->consumer.api_overhead_us);
  for (const auto& [node, t] : r.throttling) {
    std::printf("%s: throttled in %ld of %ld periods (%.1f s waiting)\n", node.c_str(), t.throttled,
                t.periods, absl::ToDoubleSeconds(t.throttled_time));
  }
  if (r.producer_counted_tokens != r.producer_sample_tokens) {
    std::printf("note: the producer counted %ld positions computed, the samples say %ld\n",
                r.producer_counted_tokens, r.producer_sample_tokens);
  }
  std::printf("profiles: %s %s (%.0f s)\nreport:   %s/profile.json\n", producer.c_str(),
              consumer.c_str(), r.seconds, o.out.c_str());
  return absl::OkStatus();
}

}  // namespace scd::bench
