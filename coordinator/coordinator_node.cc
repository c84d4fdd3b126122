#include "coordinator/coordinator_node.h"

#include <spdlog/spdlog.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "coordinator/openai_api.h"

namespace scd::coordinator {

absl::StatusOr<std::unique_ptr<CoordinatorNode>> CoordinatorNode::Start(
    const CoordinatorNodeOptions& options) {
  SCD_ASSIGN_OR_RETURN(ClusterSecret secret, ClusterSecret::Of(options.cluster_secret));
  std::unique_ptr<CoordinatorNode> node(new CoordinatorNode());
  // Health probes on both ports see NOT_SERVING while the tokenizer loads and etcd is awaited.
  SCD_ASSIGN_OR_RETURN(node->public_, StartLoadingServer(options.listen));
  SCD_ASSIGN_OR_RETURN(node->control_, StartLoadingServer(options.control_listen));
  CoordinatorOptions routing = options.routing;
  if (!options.tokenizer.empty()) {
    const std::filesystem::path path = std::filesystem::is_directory(options.tokenizer)
                                           ? std::filesystem::path(options.tokenizer) /
                                                 "tokenizer.json"
                                           : std::filesystem::path(options.tokenizer);
    SCD_ASSIGN_OR_RETURN(node->tokenizer_, Tokenizer::FromFile(path.string()));
    routing.tokenizer = node->tokenizer_.get();
    // The OpenAI API's chat prompts: the model's chat template, when it has one.
    SCD_ASSIGN_OR_RETURN(node->chat_template_,
                         ChatTemplate::FromModelDir(path.has_parent_path()
                                                        ? path.parent_path().string()
                                                        : "."));
  }
  node->serving_metrics_ = std::make_unique<ServingMetrics>(&node->metrics_);
  routing.metrics = node->serving_metrics_.get();
  RegistryOptions registry = options.registry;
  // Nodes whose tokenizer is another than this one's are refused: the ids it sends them would
  // mean other tokens there.
  if (node->tokenizer_ != nullptr) registry.tokenizer_fingerprint = node->tokenizer_->fingerprint();
  node->registry_ = std::make_unique<NodeRegistry>(registry);
  if (IsEtcdRegistry(options.registry_address)) {
    SCD_ASSIGN_OR_RETURN(node->etcd_watch_,
                         EtcdNodeWatch::Start(options.registry_address, node->registry_.get()));
    if (!node->etcd_watch_->WaitSynced(absl::Seconds(10))) {
      spdlog::warn("coordinator: etcd {} not reachable yet; routing once it is",
                   options.registry_address);
    }
  } else if (!options.registry_address.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--registry ", options.registry_address, ": expected etcd://HOST:PORT"));
  }
  node->registry_service_ =
      std::make_unique<RegistryService>(node->registry_.get(), secret, &node->counters_);
  node->inference_ = std::make_unique<CoordinatorInferenceService>(
      node->registry_.get(), secret, &node->counters_, routing);
  PublicApiGuards guards = options.guards;
  guards.tokenizer = node->tokenizer_.get();
  node->checked_ = std::make_unique<CheckedInferenceService>(
      node->inference_.get(), options.limits, /*require_target=*/true, &node->counters_,
      node->serving_metrics_.get(), guards);
  SCD_ASSIGN_OR_RETURN(node->control_,
                       ServeAfterLoading(&node->control_, {node->registry_service_.get()},
                                         {v1::Registry::service_full_name()}));
  SCD_ASSIGN_OR_RETURN(node->public_, ServeAfterLoading(&node->public_, {node->checked_.get()},
                                                        {v1::Inference::service_full_name()},
                                                        options.max_message_bytes));
  RegistryService* registry_service = node->registry_service_.get();
  MetricsRegistry* metrics = &node->metrics_;
  AddNodeStatsCollector(metrics, [registry_service](v1::NodeStats* stats) {
    registry_service->FillStats(stats);
  });
  node->http_ = std::make_shared<OpenAiHttpHandler>(
      node->public_.server->InProcessChannel(grpc::ChannelArguments()), node->tokenizer_.get(),
      std::make_shared<MetricsHttpHandler>(metrics),
      node->chat_template_ ? &*node->chat_template_ : nullptr);
  spdlog::info("coordinator serving the public API on {}, the control plane on {}",
               node->public_.address, node->control_.address);
  node->public_.health->SetServing(true);
  node->control_.health->SetServing(true);
  return node;
}

void CoordinatorNode::Shutdown(absl::Duration grace) {
  if (public_.health) public_.health->SetServing(false);
  if (control_.health) control_.health->SetServing(false);
  public_.Shutdown(absl::Now() + grace);
  etcd_watch_.reset();
  control_.Shutdown(absl::Now() + absl::Seconds(1));
}

CoordinatorNode::~CoordinatorNode() { Shutdown(absl::ZeroDuration()); }

}  // namespace scd::coordinator
