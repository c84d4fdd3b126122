// `scd-bench ucx-kills` and its hidden peer `ucx-kills-peer` (bench/ucx_kill_stress.h): the
// subcommands added to scd-bench's app, and what each does once parsed -- the rounds,
// ucx_kills.json and the summary on stdout (a failed verdict under the backend's configuration is
// an error, exit 1; under UCX's own defaults the aborts are what is measured); the peer's run.
// Thread-safety: call from main.
#ifndef SCD_BENCH_UCX_KILL_COMMAND_H_
#define SCD_BENCH_UCX_KILL_COMMAND_H_

#include <CLI/CLI.hpp>
#include <string>

#include "absl/status/status.h"
#include "bench/ucx_kill_stress.h"

namespace scd::bench {

struct UcxKillFlags {
  UcxKillOptions options;
  std::string config = "backend";
  double max_delay_ms = 300;
  size_t chunk_mib = 16;
  bool quiet = false;
};

// Adds `ucx-kills` to `app`, bound to `flags`; returns the subcommand.
CLI::App* AddUcxKillCommand(CLI::App& app, UcxKillFlags* flags);
absl::Status RunUcxKillCommand(UcxKillFlags flags);

// Adds the hidden `ucx-kills-peer` (started by ucx-kills, not by people); returns it.
CLI::App* AddUcxKillPeerCommand(CLI::App& app, UcxKillPeerOptions* options);

}  // namespace scd::bench

#endif  // SCD_BENCH_UCX_KILL_COMMAND_H_
