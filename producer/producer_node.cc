#include "producer/producer_node.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/host_port.h"
#include "base/status_macros.h"
#include "codec/fingerprint.h"
#include "proto/grpc_server.h"
#include "proto/grpc_util.h"
#include "proto/prefix_cache_stats.h"
#include "serving/serving_metrics.h"

namespace scd::producer {

absl::StatusOr<std::unique_ptr<ProducerNode>> ProducerNode::Start(
    const ProducerNodeOptions& options) {
  SCD_RETURN_IF_ERROR(CheckRegistryAddress(options.coordinator));
  if (!options.advertise.empty()) SCD_RETURN_IF_ERROR(CheckHost(options.advertise, "--advertise"));
  SCD_ASSIGN_OR_RETURN(ClusterSecret secret, ClusterSecret::Of(options.cluster_secret));
  std::unique_ptr<ProducerNode> node(new ProducerNode());
  // Health probes see NOT_SERVING while the model and artifacts load.
  SCD_ASSIGN_OR_RETURN(node->server_, StartLoadingServer(options.control_listen));
  SCD_ASSIGN_OR_RETURN(ServedModel served, LoadServedModel(options.model));
  node->name_ = std::move(served.name);
  node->fingerprint_ = std::move(served.fingerprint);
  node->model_ = std::move(served.model);
  node->tokenizer_ = std::move(served.tokenizer);
  ProducerModel model{node->model_.get(), node->tokenizer_.get(), node->name_,
                      node->fingerprint_, TransferOptions(),      {},
                      absl::Seconds(60)};
  model.prefix_cache_bytes = static_cast<int64_t>(options.prefix_cache_mb) << 20;
  model.prefill_threads = options.prefill_threads;
  for (const std::string& path : options.artifacts) {
    SCD_ASSIGN_OR_RETURN(Artifact artifact, Artifact::Load(path));
    if (artifact.producer.fingerprint != node->fingerprint_) {
      return absl::FailedPreconditionError(
          absl::StrCat("artifact ", path, " was fitted for producer ", artifact.producer.name, " (",
                       artifact.producer.fingerprint.substr(0, 12), "), not ", node->name_));
    }
    SCD_ASSIGN_OR_RETURN(std::string id, ArtifactFileId(path));
    node->artifacts_[id] = std::move(artifact);
    model.artifacts[id] = &node->artifacts_[id];
    spdlog::info("artifact {} ({} -> {}) from {}", id, node->name_,
                 node->artifacts_[id].consumer.name, path);
  }
  transport::TransportOptions transport_options;
  transport_options.backend = options.transport;
  transport_options.grpc_refused_fails_fast = true;  // its consumers listen before registering
  SCD_ASSIGN_OR_RETURN(node->transport_, transport::CreateTransport(transport_options));
  transport::ConnectionOptions connection;
  connection.max_inflight_bytes = options.max_inflight_mb << 20;
  connection.shape.gbps = options.link_gbps;
  connection.shape.latency = absl::Microseconds(options.link_latency_us);
  node->service_ = std::make_unique<ProducerControlService>(model, node->transport_.get(),
                                                            secret, connection);
  SCD_ASSIGN_OR_RETURN(node->server_, ServeAfterLoading(&node->server_, {node->service_.get()},
                                                        {v1::Producer::service_full_name()}));
  node->metrics_ = std::make_unique<MetricsRegistry>(
      MetricLabels{{"role", "producer"}, {"model", node->name_}});
  MetricsRegistry* metrics = node->metrics_.get();
  ProducerControlService* service = node->service_.get();
  AddNodeStatsCollector(metrics, [service](v1::NodeStats* stats) { service->FillStats(stats); });
  node->http_ = std::make_shared<MetricsHttpHandler>(metrics);
  spdlog::info("producer {} serving control on {} (codes over {})", node->name_, node->address(),
               options.transport);
  if (!options.coordinator.empty()) {
    v1::RegisterRequest registration;
    SetNodeIdentity(v1::NODE_ROLE_PRODUCER, AdvertisedAddress(node->address(), options.advertise),
                    node->name_, node->fingerprint_, &registration);
    registration.add_transports(options.transport);
    registration.set_capacity(options.capacity);
    if (node->tokenizer_ != nullptr) {
      registration.set_tokenizer_fingerprint(node->tokenizer_->fingerprint());
    }
    RegistryClient::PrefixBlocksFn prefix_blocks;
    if (ProducerPrefixStore* store = node->service_->prefix_store(); store != nullptr) {
      prefix_blocks = [store] { return PrefixBlocksReport(store->blocks()); };
    }
    node->registration_ = std::make_unique<RegistryClient>(
        options.coordinator, registration,
        [service](v1::HeartbeatRequest* beat) {
          *beat->mutable_speeds() = service->Speeds();
          beat->set_active_requests(service->running());
        },
        secret, prefix_blocks);
    node->registration_->Start();
  }
  node->server_.health->SetServing(true);
  return node;
}

void ProducerNode::Shutdown(absl::Duration grace) {
  if (server_.health) server_.health->SetServing(false);
  if (registration_) registration_->Stop();
  server_.Shutdown(absl::Now() + grace);
}

ProducerNode::~ProducerNode() { Shutdown(absl::ZeroDuration()); }

}  // namespace scd::producer
