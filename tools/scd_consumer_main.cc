// scd-consumer: rebuilds its own cache from a producer's codes (or prefills locally) and decodes.
//   scd-consumer [--config FILE.toml] --model DIR [--name NAME] --listen HOST:PORT --coordinator
//   HOST:PORT
//                [--transfer-listen HOST:PORT] [--transport grpc|ucx] [--artifact FILE ...]
//                [--capacity N]
// SIGTERM/SIGINT: take no new requests, leave routing, finish running ones, exit.
#include <ATen/Parallel.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <string>

#include "base/status_macros.h"
#include "consumer/consumer_node.h"
#include "tools/toml_config.h"
#include "tools/tool_common.h"

int main(int argc, char** argv) {
  scd::BlockTerminationSignals();
  scd::CommonToolFlags common;
  common.log_level = "info";
  scd::consumer::ConsumerNodeOptions options;
  double drain_seconds = 30;
  std::string address_file;
  CLI::App app{"SCD Serve consumer: cache rebuild from semantic codes, decoding"};
  app.add_option("--model", options.model_dir, "Hugging Face model directory")->required();
  app.add_option("--name", options.name, "routing name (default: the directory's name)");
  app.add_option("--listen", options.listen, "gRPC address (port 0: any free port)");
  app.add_option("--transfer-listen", options.transfer_listen, "where producers send codes");
  app.add_option("--advertise", options.advertise,
                 "host other nodes dial (default: the listen host; a wildcard: the host name)");
  app.add_option("--coordinator", options.coordinator, "coordinator address (none: standalone)");
  app.add_option("--transport", options.transport, "what codes travel over")
      ->check(CLI::IsMember({"grpc", "ucx"}));
  app.add_option("--artifact", options.artifacts, "translator artifact(s), one per producer");
  app.add_option("--capacity", options.capacity, "requests served at once")
      ->check(CLI::Range(1, 4096));
  app.add_option("--max-tokens", options.default_max_tokens, "default output length");
  app.add_option("--drain-seconds", drain_seconds, "how long SIGTERM waits for running requests");
  app.add_option("--address-file", address_file, "write the bound address here once serving");
  scd::AddCommonFlags(&app, &common, scd::kLogLevelFlag | scd::kThreadsFlag);
  scd::AddConfigFileFlag(&app);
  return scd::RunTool("scd-consumer", app, argc, argv, common, [&]() -> absl::Status {
    spdlog::set_default_logger(spdlog::stderr_color_mt("scd-consumer"));
    if (common.threads > 0) at::set_num_threads(common.threads);
    SCD_ASSIGN_OR_RETURN(auto node, scd::consumer::ConsumerNode::Start(options));
    SCD_RETURN_IF_ERROR(scd::WriteAddressFile(address_file, node->address()));
    const std::string signal = scd::WaitForTerminationSignal();
    spdlog::info("{}: draining {} running requests", signal, node->active_requests());
    node->Shutdown(absl::Seconds(drain_seconds));
    return absl::OkStatus();
  });
}
