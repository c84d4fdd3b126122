// scd-producer: runs prefill and streams each layer's codes to the consumers a request names.
//   scd-producer [--config FILE.toml] --model DIR [--name NAME] --listen HOST:PORT --coordinator
//   HOST:PORT
//                [--transport grpc|ucx] [--artifact FILE ...] [--link-gbps G --link-latency-us U]
// SIGTERM/SIGINT: leave routing, finish running prefills (up to --drain-seconds), exit.
#include <ATen/Parallel.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <string>

#include "base/status_macros.h"
#include "producer/producer_node.h"
#include "tools/toml_config.h"
#include "tools/tool_common.h"

int main(int argc, char** argv) {
  scd::BlockTerminationSignals();
  scd::CommonToolFlags common;
  common.log_level = "info";
  scd::producer::ProducerNodeOptions options;
  double drain_seconds = 30;
  std::string address_file;
  CLI::App app{"SCD Serve producer: shared prefill, layer-wise code streaming"};
  app.add_option("--model", options.model_dir, "Hugging Face model directory")->required();
  app.add_option("--name", options.name, "routing name (default: the directory's name)");
  app.add_option("--listen", options.listen, "gRPC address (port 0: any free port)");
  app.add_option("--advertise", options.advertise,
                 "host other nodes dial (default: the listen host; a wildcard: the host name)");
  app.add_option("--coordinator", options.coordinator, "coordinator address (none: standalone)");
  app.add_option("--transport", options.transport, "what codes travel over")
      ->check(CLI::IsMember({"grpc", "ucx"}));
  app.add_option("--artifact", options.artifacts, "translator artifact(s) it encodes for");
  app.add_option("--link-gbps", options.link_gbps, "shape every session (0: off)");
  app.add_option("--link-latency-us", options.link_latency_us, "one-way latency per frame");
  app.add_option("--max-inflight-mb", options.max_inflight_mb, "unacknowledged bytes per session");
  app.add_option("--drain-seconds", drain_seconds, "how long SIGTERM waits for running work");
  app.add_option("--address-file", address_file, "write the bound address here once serving");
  scd::AddCommonFlags(&app, &common, scd::kLogLevelFlag | scd::kThreadsFlag);
  scd::AddConfigFileFlag(&app);
  return scd::RunTool("scd-producer", app, argc, argv, common, [&]() -> absl::Status {
    spdlog::set_default_logger(spdlog::stderr_color_mt("scd-producer"));
    if (common.threads > 0) at::set_num_threads(common.threads);
    SCD_ASSIGN_OR_RETURN(auto node, scd::producer::ProducerNode::Start(options));
    SCD_RETURN_IF_ERROR(scd::WriteAddressFile(address_file, node->address()));
    const std::string signal = scd::WaitForTerminationSignal();
    spdlog::info("{}: draining", signal);
    node->Shutdown(absl::Seconds(drain_seconds));
    return absl::OkStatus();
  });
}
