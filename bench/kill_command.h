// `scd-bench kills`'s flags and run (bench/kill_bench.h): the subcommand added to scd-bench's app,
// and what it does once parsed -- the run, kills.json and the summary on stdout; a failed verdict
// is an error (exit 1).
// Thread-safety: call from main.
#ifndef SCD_BENCH_KILL_COMMAND_H_
#define SCD_BENCH_KILL_COMMAND_H_

#include <CLI/CLI.hpp>
#include <string>

#include "absl/status/status.h"
#include "bench/kill_bench.h"

namespace scd::bench {

struct KillFlags {
  KillBenchOptions options;
  std::string shared_dir;
  bool quiet = false;
};

// Adds `kills` to `app`, bound to `flags`; returns the subcommand.
CLI::App* AddKillCommand(CLI::App& app, KillFlags* flags);
absl::Status RunKillCommand(KillFlags flags);

}  // namespace scd::bench

#endif  // SCD_BENCH_KILL_COMMAND_H_
