// scd-consumer: rebuilds its own cache from a producer's codes (or prefills locally) and decodes.
// Three listeners: the public API (--listen), the control plane the coordinator calls
// (--control-listen, cluster secret required) and the transfer listener producers send codes to.
//   scd-consumer [--config FILE.toml] --model DIR|--dummy-weights CONFIG [--layers N] [--seed S]
//                [--name NAME] [--device D] [--dtype T] --listen HOST:PORT
//                --control-listen HOST:PORT --coordinator HOST:PORT
//                [--cluster-secret-file FILE | $SCD_CLUSTER_SECRET]
//                [--advertise HOST] [--transfer-listen HOST:PORT]
//                [--transport grpc|ucx] [--artifact FILE ...] [--capacity N]
//                [--kv-cache-mb M] [--max-queued N] [--max-batched-tokens N]
//                [--transfer-timeout SECONDS]
//                [--http-listen HOST:PORT] [--tls-cert F --tls-key F] [--tls-ca F]
//                [--tls-require-client-cert] [--api-token-file F] [--max-requests-per-client N]
//                [--max-prompt-tokens N] [--max-output-tokens N] [--max-message-mb M]
// SIGTERM/SIGINT: take no new requests, leave routing, finish running ones, exit.

#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>

#include "base/status_macros.h"
#include "consumer/consumer_node.h"
#include "model/blas_kernel.h"
#include "model/runtime.h"
#include "tools/tool_common.h"

int main(int argc, char** argv) {
  scd::SelectBlasKernel(argc, argv);  // first: it may run the program again on better kernels
  scd::DaemonFlags daemon;
  scd::consumer::ConsumerNodeOptions options;
  options.model.seed = 2;  // scd-calib synth's --consumer-seed default
  CLI::App app{"SCD Serve consumer: cache rebuild from semantic codes, decoding"};
  scd::AddServingNodeFlags(&app, &options, "translator artifact(s), one per producer");
  app.add_option("--listen", options.listen, "public API gRPC address (port 0: any free port)");
  app.add_option("--transfer-listen", options.transfer_listen, "where producers send codes");
  scd::AddConsumerBatchingFlags(&app, &options);
  app.add_option("--max-tokens", options.default_max_tokens, "default output length")
      ->check(CLI::TypeValidator<uint32_t>())->check(CLI::Range(1, 1 << 20));
  scd::AddPublicApiFlags(&app, &daemon.public_api);
  scd::AddDaemonFlags(&app, &daemon, scd::kLogLevelFlag | scd::kThreadsFlag);
  return scd::RunDaemon(
      "scd-consumer", app, argc, argv, daemon, [&]() -> absl::StatusOr<scd::DaemonHandle> {
        // The project's one thread policy (BLAS pool vs libtorch's pool), as every tool uses.
        spdlog::info("threads: {}", scd::ConfigureThreads(daemon.common.threads).ToString());
        SCD_ASSIGN_OR_RETURN(options.cluster_secret, daemon.ClusterSecret());
        SCD_RETURN_IF_ERROR(daemon.public_api.Apply(&options.limits, &options.guards));
        options.max_message_bytes = daemon.public_api.max_message_bytes();
        SCD_ASSIGN_OR_RETURN(auto node, scd::consumer::ConsumerNode::Start(options));
        return scd::DaemonHandle::Of(std::move(node));
      });
}
