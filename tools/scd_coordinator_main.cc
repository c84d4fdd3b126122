// scd-coordinator: the registry (leases) and the public Inference API, routing requests to
// producers and consumers. Two planes: the public API on --listen, the registry (nodes register
// with --coordinator naming this address) on --control-listen, cluster secret required.
//   scd-coordinator [--config FILE.toml] --listen HOST:PORT --control-listen HOST:PORT
//                   [--cluster-secret-file FILE | $SCD_CLUSTER_SECRET] [--lease-ms 2000]
//                   [--strict-modes] [--no-early-prefill] [--migration-limit 3]
//                   [--address-file PATH] [--control-address-file PATH]
//                   [--http-listen HOST:PORT] (OpenAI API, /health, /metrics) [--tls-* ...]
//                   [--api-token-file F] [--max-requests-per-client N] [--max-prompt-tokens N]
//                   [--max-output-tokens N] [--max-message-mb M]
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
  app.add_option("--listen", options.listen, "public API gRPC address (port 0: any free port)");
  app.add_option("--control-listen", options.control_listen,
                 "control-plane gRPC address the nodes register at (port 0: any free port)");
  app.add_option("--lease-ms", lease_ms, "a node silent this long leaves routing")
      ->check(CLI::TypeValidator<int>())->check(CLI::Range(100, 600000));
  app.add_option("--heartbeat-ms", heartbeat_ms, "how often nodes are asked to heartbeat")
      ->check(CLI::TypeValidator<int>())->check(CLI::Range(20, 60000));
  app.add_option("--tokenizer", options.tokenizer,
                 "the serving models' tokenizer.json (or a model directory): text prompts are "
                 "routed to the nodes caching their prefix (without it only prompt_ids are)");
  app.add_option("--prefix-load-weight", options.registry.prefix_load_weight,
                 "cache-aware routing: one active request weighs this many cold prefills of the "
                 "prompt against a cache match")
      ->check(CLI::Range(0.0, 1000.0));
  app.add_option("--registry", options.registry_address,
                 "etcd://HOST:PORT: route the nodes registered in this etcd (shared with other "
                 "coordinators; nodes give the same --registry); default: nodes register at "
                 "--control-listen");
  app.add_flag("--strict-modes", options.registry.strict_modes,
               "refuse raw/int4/reuse between different weights instead of serving them degraded");
  bool no_early_prefill = false;
  app.add_flag("--no-early-prefill", no_early_prefill,
               "start a producer's Prefill only after the consumer's Started (no prefill for a "
               "request its consumer refuses; about one hop more time to first token)");
  app.add_option("--migration-limit", options.routing.migration_limit,
                 "moves a stream may make to another replica of its target when the consumer "
                 "serving it dies or fails it (0: never; a request may ask for fewer)")
      ->check(CLI::Range(0, 100));
  scd::AddPublicApiFlags(&app, &daemon.public_api);
  scd::AddDaemonFlags(&app, &daemon, scd::kLogLevelFlag);
  return scd::RunDaemon(
      "scd-coordinator", app, argc, argv, daemon, [&]() -> absl::StatusOr<scd::DaemonHandle> {
        options.routing.early_prefill = !no_early_prefill;
        options.registry.lease = absl::Milliseconds(lease_ms);
        options.registry.heartbeat_interval = absl::Milliseconds(heartbeat_ms);
        SCD_ASSIGN_OR_RETURN(options.cluster_secret, daemon.ClusterSecret());
        SCD_RETURN_IF_ERROR(daemon.public_api.Apply(&options.limits, &options.guards));
        options.max_message_bytes = daemon.public_api.max_message_bytes();
        SCD_ASSIGN_OR_RETURN(auto node, scd::coordinator::CoordinatorNode::Start(options));
        return scd::DaemonHandle::Of(std::move(node));
      });
}
