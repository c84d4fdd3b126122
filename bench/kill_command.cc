#include "bench/kill_command.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "base/shared_dir.h"

namespace scd::bench {

CLI::App* AddKillCommand(CLI::App& app, KillFlags* f) {
  CLI::App* k = app.add_subcommand(
      "kills", "consumers killed mid-decode with a replica alive: each stream must move on");
  k->add_option("--kills", f->options.kills, "replicas killed mid-decode")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  k->add_option("--max-tokens", f->options.max_tokens, "each request's max_tokens")
      ->check(CLI::Range(2, 400))
      ->capture_default_str();
  k->add_option("--transport", f->options.transport, "what codes travel over")
      ->check(CLI::IsMember({"grpc", "ucx"}))
      ->capture_default_str();
  k->add_option("--out", f->options.out, "the nodes' logs and kills.json")->required();
  k->add_option("--shared-dir", f->shared_dir,
                "models/ and data/ (default: $SCD_SHARED_DIR, else shared/ beside the checkout)");
  k->add_flag("--quiet", f->quiet, "no progress bar");
  return k;
}

absl::Status RunKillCommand(KillFlags f) {
  KillBenchOptions& o = f.options;
  o.progress = !f.quiet;
  o.bin_dir = ExecutableDir();
  o.shared_dir = ResolveSharedDir(f.shared_dir);
  std::filesystem::create_directories(o.out);
  o.out = std::filesystem::absolute(o.out).string();
  absl::StatusOr<KillBenchReport> report = RunKillBench(o);
  if (!report.ok()) return report.status();
  const std::string json = o.out + "/kills.json";
  std::ofstream(json) << KillBenchJson(*report) << "\n";
  std::fputs(KillBenchSummary(*report).c_str(), stdout);
  std::printf("report: %s\n", json.c_str());
  if (!report->pass()) return absl::InternalError("kills: a stream did not move on as it must");
  return absl::OkStatus();
}

}  // namespace scd::bench
