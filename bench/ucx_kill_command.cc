#include "bench/ucx_kill_command.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "base/shared_dir.h"

namespace scd::bench {

CLI::App* AddUcxKillCommand(CLI::App& app, UcxKillFlags* f) {
  CLI::App* k = app.add_subcommand(
      "ucx-kills", "UCX peers killed or closed mid-transfer: the survivor must not abort");
  k->add_option("--rounds", f->options.rounds, "faults (kill and close alternate)")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  k->add_option("--stop-after-aborts", f->options.stop_after_aborts,
                "stop once this many rounds aborted (0: run every round)")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  k->add_option("--config", f->config,
                "backend: the UCX backend as shipped; ucx-defaults: UCX 1.13's own tcp settings "
                "(PUT, zero-copy) forced through the environment")
      ->check(CLI::IsMember({"backend", "ucx-defaults"}))
      ->capture_default_str();
  k->add_option("--tls", f->options.tls, "UCX_TLS for both peers")->capture_default_str();
  k->add_option("--chunk-mib", f->chunk_mib, "each send's size, both ways")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  k->add_option("--max-delay-ms", f->max_delay_ms,
                "the fault lands 0..this long after both peers flow")
      ->check(CLI::Range(0.0, 60000.0))
      ->capture_default_str();
  k->add_option("--seed", f->options.seed, "the delays")->capture_default_str();
  k->add_option("--out", f->options.out, "ucx_kills.json and the logs of rounds that went wrong")
      ->required();
  k->add_flag("--quiet", f->quiet, "no progress bar");
  return k;
}

absl::Status RunUcxKillCommand(UcxKillFlags f) {
  UcxKillOptions& o = f.options;
  o.config = f.config == "backend" ? UcxConfig::kBackend : UcxConfig::kUcxDefaults;
  o.chunk_bytes = f.chunk_mib << 20;
  o.max_delay = absl::Milliseconds(f.max_delay_ms);
  o.progress = !f.quiet;
  o.peer_binary = ExecutableDir() + "/scd-bench";
  std::filesystem::create_directories(o.out);
  o.out = std::filesystem::absolute(o.out).string();
  absl::StatusOr<UcxKillReport> report = RunUcxKills(o);
  if (!report.ok()) return report.status();
  const std::string json = o.out + "/ucx_kills.json";
  std::ofstream(json) << UcxKillJson(*report) << "\n";
  std::fputs(UcxKillSummary(*report).c_str(), stdout);
  std::printf("report: %s\n", json.c_str());
  if (o.config == UcxConfig::kBackend && !report->pass()) {
    return absl::InternalError(absl::StrCat("ucx-kills: ", report->aborts(), " aborted, ",
                                            report->hangs(), " hung, ", report->failed(),
                                            " failed under the backend's configuration"));
  }
  return absl::OkStatus();
}

CLI::App* AddUcxKillPeerCommand(CLI::App& app, UcxKillPeerOptions* o) {
  CLI::App* p = app.add_subcommand("ucx-kills-peer", "");  // no description: hidden
  p->group("");
  p->add_option("--address-file", o->address_file)->required();
  p->add_option("--peer-file", o->peer_file)->required();
  p->add_option("--flowing-file", o->flowing_file)->required();
  p->add_option("--chunk-bytes", o->chunk_bytes)->check(CLI::Range(size_t{1}, size_t{1} << 30));
  return p;
}

}  // namespace scd::bench
