#include "bench/soak_command.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/plot_script.h"
#include "base/shared_dir.h"

namespace scd::bench {

CLI::App* AddSoakCommand(CLI::App& app, SoakFlags* f) {
  CLI::App* s = app.add_subcommand(
      "soak", "a long mixed load on real daemons under a fault schedule, checked per request");
  s->add_option("--duration", f->duration_s, "seconds of load")
      ->check(CLI::Range(10.0, 7 * 86400.0))
      ->capture_default_str();
  s->add_option("--rate", f->options.rate, "requests per second (Poisson)")
      ->check(CLI::Range(0.01, 1000.0))
      ->capture_default_str();
  s->add_option("--fault-gap", f->fault_gap_s, "steady seconds before each fault")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  s->add_option("--seed", f->options.seed, "the requests' draw and arrivals")
      ->capture_default_str();
  s->add_option("--transport", f->options.transport, "what codes travel over")
      ->check(CLI::IsMember({"grpc", "ucx"}))
      ->capture_default_str();
  s->add_option("--link", f->options.link,
                "the producer's link: shaper (loopback, shaped by the flaps) or netns (a network "
                "namespace of its own, root: also taken down and up every cycle)")
      ->check(CLI::IsMember({"shaper", "netns"}))
      ->capture_default_str();
  s->add_option("--rss-min-requests", f->options.rss_min_requests,
                "judge a process's RSS growth only over at least this many requests")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  s->add_option("--out", f->options.out, "logs, artifacts, soak.json, soak.png")->required();
  s->add_option("--shared-dir", f->shared_dir,
                "models/ and data/ (default: $SCD_SHARED_DIR, else shared/ beside the checkout)");
  s->add_flag("--smoke", f->smoke,
              "3 minutes: 150 s of load, every fault kind once, 4 s between faults");
  s->add_flag("--quiet", f->quiet, "no progress bars");
  return s;
}

absl::Status RunSoakCommand(SoakFlags f) {
  SoakOptions& o = f.options;
  o.duration = absl::Seconds(f.smoke ? 150 : f.duration_s);
  o.fault_gap = absl::Seconds(f.smoke ? 4 : f.fault_gap_s);
  if (f.smoke) o.min_moves = o.min_resumes = o.min_fallbacks = 0;  // reported, not judged
  o.progress = !f.quiet;
  o.bin_dir = ExecutableDir();
  o.shared_dir = ResolveSharedDir(f.shared_dir);
  std::filesystem::create_directories(o.out);
  o.out = std::filesystem::absolute(o.out).string();
  absl::StatusOr<SoakReport> report = RunSoak(o);
  if (!report.ok()) return report.status();
  const std::string json = o.out + "/soak.json";
  std::ofstream(json) << SoakJson(*report) << "\n";
  std::fputs(SoakSummaryText(*report).c_str(), stdout);
  const absl::Status plot = RunPlotScript("plot_soak.py", {json, o.out + "/soak.png"});
  if (!plot.ok()) std::fprintf(stderr, "scd-bench soak: no plot: %s\n", plot.ToString().c_str());
  std::printf("report: %s\nplot:   %s/soak.png\n", json.c_str(), o.out.c_str());
  if (!report->pass()) {
    return absl::InternalError(
        absl::StrCat("the soak failed: ", absl::StrJoin(report->failures, "; ")));
  }
  return absl::OkStatus();
}

}  // namespace scd::bench
