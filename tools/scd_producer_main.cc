// scd-producer: runs prefill and streams each layer's codes to the consumers a request names.
// It has only a control plane: the coordinator calls it with the cluster secret.
//   scd-producer [--config FILE.toml] --model DIR|--dummy-weights CONFIG [--layers N] [--seed S]
//                [--name NAME] [--device D] [--dtype T] --control-listen HOST:PORT
//                --coordinator HOST:PORT [--cluster-secret-file FILE | $SCD_CLUSTER_SECRET]
//                [--advertise HOST] [--transport grpc|ucx]
//                [--artifact FILE ...] [--link-gbps G --link-latency-us U]
// The link shape can be changed at run time through the coordinator (Registry.SetLinkShape).
// SIGTERM/SIGINT: leave routing, finish running prefills (up to --drain-seconds), exit.

#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>

#include "base/status_macros.h"
#include "model/blas_kernel.h"
#include "model/runtime.h"
#include "producer/producer_node.h"
#include "tools/tool_common.h"

int main(int argc, char** argv) {
  scd::SelectBlasKernel(argc, argv);  // first: it may run the program again on better kernels
  scd::DaemonFlags daemon;
  scd::producer::ProducerNodeOptions options;
  options.model.seed = 1;  // scd-calib synth's --producer-seed default
  CLI::App app{"SCD Serve producer: shared prefill, layer-wise code streaming"};
  scd::AddServingNodeFlags(&app, &options, "translator artifact(s) it encodes for");
  app.add_option("--link-gbps", options.link_gbps, "shape every session (0: off)")
      ->check(CLI::Number)->check(CLI::Range(0.0, 1.0e6));
  app.add_option("--link-latency-us", options.link_latency_us, "one-way latency per frame")
      ->check(CLI::Number)->check(CLI::Range(0.0, 1.0e7));
  app.add_option("--max-inflight-mb", options.max_inflight_mb, "unacknowledged bytes per session")
      ->check(CLI::TypeValidator<size_t>())->check(CLI::Range(1, 1 << 16));
  app.add_option("--capacity", options.capacity,
                 "prefills at once the coordinator routes here before preferring another producer "
                 "(0: no limit)");
  app.add_option("--prefill-threads", options.prefill_threads,
                 "prefills run at once; more wait in a queue holding no thread")
      ->check(CLI::Range(1, 1024));
  scd::AddDaemonFlags(&app, &daemon, scd::kLogLevelFlag | scd::kThreadsFlag);
  return scd::RunDaemon(
      "scd-producer", app, argc, argv, daemon, [&]() -> absl::StatusOr<scd::DaemonHandle> {
        // The project's one thread policy (BLAS pool vs libtorch's pool), as every tool uses.
        spdlog::info("threads: {}", scd::ConfigureThreads(daemon.common.threads).ToString());
        SCD_ASSIGN_OR_RETURN(options.cluster_secret, daemon.ClusterSecret());
        SCD_ASSIGN_OR_RETURN(auto node, scd::producer::ProducerNode::Start(options));
        return scd::DaemonHandle::Of(std::move(node));
      });
}
