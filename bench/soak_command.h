// `scd-bench soak`'s flags and run (bench/soak.h): the subcommand added to scd-bench's app, and
// what it does once parsed -- the run, soak.json, soak.png (bench/plot_soak.py), the summary
// on stdout; a failed verdict is an error (exit 1), naming what failed.
// Thread-safety: call from main.
#ifndef SCD_BENCH_SOAK_COMMAND_H_
#define SCD_BENCH_SOAK_COMMAND_H_

#include <CLI/CLI.hpp>
#include <string>

#include "absl/status/status.h"
#include "bench/soak.h"

namespace scd::bench {

struct SoakFlags {
  SoakOptions options;
  double duration_s = 1800, fault_gap_s = 20;
  std::string shared_dir;
  bool smoke = false, quiet = false;
};

// Adds `soak` to `app`, bound to `flags`; returns the subcommand.
CLI::App* AddSoakCommand(CLI::App& app, SoakFlags* flags);
absl::Status RunSoakCommand(SoakFlags flags);

}  // namespace scd::bench

#endif  // SCD_BENCH_SOAK_COMMAND_H_
