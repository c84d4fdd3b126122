// scd-coordinator: the registry (leases) and the public Inference API, routing requests to
// producers and consumers.
//   scd-coordinator [--config FILE.toml] --listen HOST:PORT [--lease-ms 2000] [--address-file PATH]
// SIGTERM/SIGINT: stop taking requests, finish running ones (up to --drain-seconds), exit.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <string>

#include "base/status_macros.h"
#include "coordinator/coordinator_node.h"
#include "tools/toml_config.h"
#include "tools/tool_common.h"

int main(int argc, char** argv) {
  scd::BlockTerminationSignals();
  scd::CommonToolFlags common;
  common.log_level = "info";
  scd::coordinator::CoordinatorNodeOptions options;
  int lease_ms = 2000, heartbeat_ms = 500;
  double drain_seconds = 30;
  std::string address_file;
  CLI::App app{"SCD Serve coordinator: registry and request routing"};
  app.add_option("--listen", options.listen, "gRPC address (port 0: any free port)");
  app.add_option("--lease-ms", lease_ms, "a node silent this long leaves routing")
      ->check(CLI::Range(100, 600000));
  app.add_option("--heartbeat-ms", heartbeat_ms, "how often nodes are asked to heartbeat")
      ->check(CLI::Range(20, 60000));
  app.add_option("--drain-seconds", drain_seconds, "how long SIGTERM waits for running requests");
  app.add_option("--address-file", address_file, "write the bound address here once serving");
  scd::AddCommonFlags(&app, &common, scd::kLogLevelFlag);
  scd::AddConfigFileFlag(&app);
  return scd::RunTool("scd-coordinator", app, argc, argv, common, [&]() -> absl::Status {
    spdlog::set_default_logger(spdlog::stderr_color_mt("scd-coordinator"));  // stdout: nothing
    options.registry.lease = absl::Milliseconds(lease_ms);
    options.registry.heartbeat_interval = absl::Milliseconds(heartbeat_ms);
    SCD_ASSIGN_OR_RETURN(auto node, scd::coordinator::CoordinatorNode::Start(options));
    SCD_RETURN_IF_ERROR(scd::WriteAddressFile(address_file, node->address()));
    const std::string signal = scd::WaitForTerminationSignal();
    spdlog::info("{}: draining", signal);
    node->Shutdown(absl::Seconds(drain_seconds));
    return absl::OkStatus();
  });
}
