// scd-bench: the benchmark harness (bench/README.md).
//   scd-bench serve --server HOST:PORT --targets xs[,b] [--mode M] [--request-rate 1,2,inf]
//                   [--burstiness B] [--max-concurrency C] [--num-prompts N]
//                   [--prompts FILE | --input-len T [--shared-prefix-len P] [--vocab-size V]]
//                   [--output-len M] [--metric-percentiles 50,90,99]
//                   [--goodput ttft:MS tpot:MS e2el:MS] [--out DIR]
//     A load after `vllm bench serve`: the table on stdout per rate; with --out, serve-<rate>.json
//     per rate (totals and per-request arrays) and, for several rates, serve.png (TTFT and TPOT
//     against the request rate, bench/plot_serve.py).
// Errors: one line on stderr, exit status 1.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/progress.h"
#include "base/status_macros.h"
#include "bench/serve_benchmark.h"

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
  int vocab_size = 512;
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

std::string RateName(double rate) {
  return std::isfinite(rate) ? absl::StrFormat("%g", rate) : "inf";
}

// bench/plot_serve.py beside the sources (this binary knows where it was built from).
std::string ScriptPath(const char* name) { return absl::StrCat(SCD_SOURCE_DIR, "/bench/", name); }

// Debian's interpreter, where python3-matplotlib lives (a python3 earlier on PATH, e.g. pyenv's,
// may lack it).
std::string Python() {
  return fs::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
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
    o.prompts = RandomPrompts(flags.num_prompts, flags.input_len, flags.shared_prefix_len,
                              flags.vocab_size, o.seed);
  }
  if (!flags.out.empty()) fs::create_directories(flags.out);
  std::vector<std::string> written;
  for (double rate : rates) {
    o.request_rate = rate;
    Progress progress(absl::StrCat("rate ", RateName(rate)),
                      static_cast<int64_t>(o.prompts.size()), !flags.quiet);
    o.on_progress = [&](int, int) { progress.Advance(); };
    SCD_ASSIGN_OR_RETURN(ServeBenchResult result, RunServeBenchmark(o));
    progress.Done();
    std::fputs(ServeBenchTable(result).c_str(), stdout);
    std::fflush(stdout);
    if (!flags.out.empty()) {
      const std::string path = absl::StrCat(flags.out, "/serve-", RateName(rate), ".json");
      std::ofstream(path) << ServeBenchJson(result, o) << "\n";
      written.push_back(path);
    }
  }
  if (!flags.out.empty() && written.size() > 1) {
    std::string command = absl::StrCat(Python(), " ", ScriptPath("plot_serve.py"), " --out ",
                                       flags.out, "/serve.png");
    for (const std::string& path : written) absl::StrAppend(&command, " ", path);
    if (std::system(command.c_str()) != 0) {
      return absl::InternalError(absl::StrCat("plotting failed: ", command));
    }
    std::fprintf(stderr, "scd-bench: wrote %s/serve.png\n", flags.out.c_str());
  }
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  CLI::App app{"scd-bench: serving load and bandwidth-sweep benchmarks"};
  app.require_subcommand(1);
  ServeFlags serve;
  CLI::App* s = app.add_subcommand("serve", "a request load on a running server (vllm bench serve)");
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
      ->check(CLI::PositiveNumber)->capture_default_str();
  s->add_option("--max-concurrency", serve.options.max_concurrency,
                "requests in flight at most (0: unbounded)")
      ->check(CLI::NonNegativeNumber);
  s->add_option("--num-prompts", serve.num_prompts, "requests per run")
      ->check(CLI::Range(1, 1000000))->capture_default_str();
  CLI::Option* file = s->add_option("--prompts", serve.prompts_file,
                                    "text prompts, one per line (else random token ids)");
  s->add_option("--input-len", serve.input_len, "random prompts: ids per prompt")
      ->check(CLI::Range(1, 1 << 20))->excludes(file)->capture_default_str();
  s->add_option("--shared-prefix-len", serve.shared_prefix_len,
                "random prompts: ids every prompt starts with (SGLang's generated shared prefix)")
      ->check(CLI::Range(0, 1 << 20))->excludes(file);
  s->add_option("--vocab-size", serve.vocab_size,
                "random prompts: ids are drawn from [3, V) (the served models' vocabulary)")
      ->check(CLI::Range(4, 1 << 24))->excludes(file)->capture_default_str();
  s->add_option("--output-len", serve.options.output_len, "max_tokens of every request")
      ->check(CLI::Range(1, 1 << 20))->capture_default_str();
  s->add_option("--seed", serve.options.seed, "prompts and arrival times");
  s->add_option("--metric-percentiles", serve.percentiles, "comma-separated")
      ->capture_default_str();
  s->add_option("--goodput", serve.goodput, "SLOs: ttft:MS tpot:MS e2el:MS (any subset)");
  s->add_option("--out", serve.out, "write serve-<rate>.json (and serve.png) here");
  s->add_flag("--quiet", serve.quiet, "no progress bar");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  spdlog::set_default_logger(spdlog::stderr_color_mt("scd-bench"));
  absl::Status status = RunServe(serve);
  if (!status.ok()) {
    std::fprintf(stderr, "scd-bench: error: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace scd::bench

int main(int argc, char** argv) { return scd::bench::Main(argc, argv); }
