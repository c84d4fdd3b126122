// scd-serve-bench: output tokens/s and latency of a server under C concurrent requests (a closed
// loop: each client sends its next request as soon as the previous one finished), for each C of
// a list, against a running coordinator or `scd serve --all-in-one` (bench/serve_concurrency.sh
// starts one). Rounds alternate the concurrency levels so a slow phase of a shared machine hits
// every level; the table shows the median round and the ratio to C = 1 of the same run.
//
//   scd-serve-bench --server HOST:PORT --target xs [--mode local] [--max-tokens 128]
//                   [--concurrency 1,2,4,8] [--seconds 5] [--rounds 3] [--json]
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "proto/wire_mode.h"
#include "serving/load_generator.h"

namespace scd {
namespace {

struct Flags {
  std::string server;
  std::string target;
  std::string mode = "local";
  std::string prompt = "Once upon a time, there was a little girl named Lily. She";
  int max_tokens = 128;
  std::vector<int> concurrency = {1, 2, 4, 8};
  double seconds = 5;
  int rounds = 3;
  bool json = false;
};

LoadReport Median(std::vector<LoadReport> reports) {
  std::sort(reports.begin(), reports.end(), [](const LoadReport& a, const LoadReport& b) {
    return a.output_tokens_per_s() < b.output_tokens_per_s();
  });
  return reports[reports.size() / 2];
}

int Run(const Flags& flags) {
  LoadOptions options;
  options.server = flags.server;
  options.request.set_prompt(flags.prompt);
  options.request.add_targets(flags.target);
  SetRequestModeName(flags.mode, &options.request);
  options.request.set_max_tokens(static_cast<uint32_t>(flags.max_tokens));
  options.request.set_temperature(0);
  options.duration = absl::Milliseconds(500);
  if (auto warm = RunClosedLoop(options); !warm.ok() || warm->requests == 0) {
    std::fprintf(stderr, "scd-serve-bench: warm-up failed: %s\n",
                 warm.ok() ? warm->first_error.c_str() : warm.status().ToString().c_str());
    return 1;
  }
  options.duration = absl::Seconds(flags.seconds);
  std::map<int, std::vector<LoadReport>> runs;
  for (int round = 0; round < flags.rounds; ++round) {
    for (int c : flags.concurrency) {
      options.concurrency = c;
      absl::StatusOr<LoadReport> report = RunClosedLoop(options);
      if (!report.ok()) {
        std::fprintf(stderr, "scd-serve-bench: %s\n", report.status().ToString().c_str());
        return 1;
      }
      if (report->failed > 0) {
        std::fprintf(stderr, "scd-serve-bench: C=%d: %lld requests failed: %s\n", c,
                     static_cast<long long>(report->failed), report->first_error.c_str());
      }
      runs[c].push_back(*report);
    }
  }
  const double base = Median(runs[flags.concurrency.front()]).output_tokens_per_s();
  if (!flags.json) {
    std::printf(
        "# %s, target %s, mode %s, %d tokens per request, %d rounds of %.0f s (median round)\n",
        flags.server.c_str(), flags.target.c_str(), flags.mode.c_str(), flags.max_tokens,
        flags.rounds, flags.seconds);
    std::printf(
        "| C | requests/s | output tok/s | vs C=%d | p50 latency s | p99 latency s | p50 TTFT ms | "
        "failed |\n",
        flags.concurrency.front());
    std::printf("|---|---|---|---|---|---|---|---|\n");
  }
  for (int c : flags.concurrency) {
    const LoadReport m = Median(runs[c]);
    int64_t failed = 0;
    for (const LoadReport& r : runs[c]) failed += r.failed;
    if (flags.json) {
      std::printf(
          "{\"concurrency\": %d, \"requests_per_s\": %.3f, \"output_tokens_per_s\": %.1f, "
          "\"ratio\": %.3f, \"latency_p50_s\": %.4f, \"latency_p99_s\": %.4f, "
          "\"ttft_p50_ms\": %.2f, \"failed\": %lld}\n",
          c, m.requests_per_s(), m.output_tokens_per_s(),
          base > 0 ? m.output_tokens_per_s() / base : 0, m.latency_p50, m.latency_p99,
          m.ttft_p50 * 1e3, static_cast<long long>(failed));
    } else {
      std::printf("| %d | %.2f | %.0f | %.2fx | %.3f | %.3f | %.1f | %lld |\n", c,
                  m.requests_per_s(), m.output_tokens_per_s(),
                  base > 0 ? m.output_tokens_per_s() / base : 0, m.latency_p50, m.latency_p99,
                  m.ttft_p50 * 1e3, static_cast<long long>(failed));
    }
  }
  return 0;
}

}  // namespace
}  // namespace scd

int main(int argc, char** argv) {
  scd::Flags flags;
  CLI::App app{"Output tokens/s and latency of a serving API under C concurrent requests"};
  app.add_option("--server", flags.server, "coordinator or all-in-one server (host:port)")
      ->required();
  app.add_option("--target", flags.target, "consumer model name")->required();
  app.add_option("--mode", flags.mode, "transfer mode of every request");
  app.add_option("--prompt", flags.prompt, "prompt of every request");
  app.add_option("--max-tokens", flags.max_tokens, "tokens per request (greedy)")
      ->check(CLI::PositiveNumber);
  app.add_option("--concurrency", flags.concurrency, "requests in flight, one level per entry")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  app.add_option("--seconds", flags.seconds, "per level and round")->check(CLI::PositiveNumber);
  app.add_option("--rounds", flags.rounds, "alternating rounds (median shown)")
      ->check(CLI::PositiveNumber);
  app.add_flag("--json", flags.json, "one JSON line per level");
  CLI11_PARSE(app, argc, argv);
  spdlog::set_default_logger(spdlog::stderr_color_mt("scd-serve-bench"));
  return scd::Run(flags);
}
