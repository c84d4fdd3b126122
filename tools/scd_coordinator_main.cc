// scd-coordinator: the registry (leases) and the public Inference API, routing requests to
// producers and consumers.
//   scd-coordinator [--config FILE.toml] --listen HOST:PORT [--lease-ms 2000] [--address-file PATH]
// SIGTERM/SIGINT: stop taking requests, finish running ones (up to --drain-seconds), exit.
#include <CLI/CLI.hpp>

#include "base/status_macros.h"
#include "coordinator/coordinator_node.h"
#include "tools/tool_common.h"

int main(int argc, char** argv) {
  scd::DaemonFlags daemon;
  scd::coordinator::CoordinatorNodeOptions options;
  int lease_ms = 2000, heartbeat_ms = 500;
  CLI::App app{"SCD Serve coordinator: registry and request routing"};
  app.add_option("--listen", options.listen, "gRPC address (port 0: any free port)");
  app.add_option("--lease-ms", lease_ms, "a node silent this long leaves routing")
      ->check(CLI::Range(100, 600000));
  app.add_option("--heartbeat-ms", heartbeat_ms, "how often nodes are asked to heartbeat")
      ->check(CLI::Range(20, 60000));
  scd::AddDaemonFlags(&app, &daemon, scd::kLogLevelFlag);
  return scd::RunDaemon(
      "scd-coordinator", app, argc, argv, daemon, [&]() -> absl::StatusOr<scd::DaemonHandle> {
        options.registry.lease = absl::Milliseconds(lease_ms);
        options.registry.heartbeat_interval = absl::Milliseconds(heartbeat_ms);
        SCD_ASSIGN_OR_RETURN(auto node, scd::coordinator::CoordinatorNode::Start(options));
        return scd::DaemonHandle::Of(std::move(node));
      });
}
