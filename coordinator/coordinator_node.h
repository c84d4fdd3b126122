// CoordinatorNode: what one scd-coordinator process runs: the node registry (leases) and two
// gRPC servers, one per plane: the public Inference API (checked in front, CheckedInferenceService)
// on `listen`, and the control plane (Registry, Stats; cluster secret on every call) on
// `control_listen`, which only the cluster's nodes should reach.
// tools/scd_coordinator_main.cc is flags -> CoordinatorNodeOptions -> Start.
// Thread-safety: Shutdown from any one thread.
#ifndef SCD_COORDINATOR_COORDINATOR_NODE_H_
#define SCD_COORDINATOR_COORDINATOR_NODE_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "base/http_server.h"
#include "base/metrics.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/etcd_node_watch.h"
#include "coordinator/node_registry.h"
#include "proto/grpc_server.h"
#include "serving/checked_inference.h"
#include "serving/serving_metrics.h"
#include "tokenizer/chat_template.h"

namespace scd::coordinator {

struct CoordinatorNodeOptions {
  std::string listen = "127.0.0.1:0";          // public Inference API
  std::string control_listen = "127.0.0.1:0";  // Registry (nodes register here)
  std::string cluster_secret;                  // required (proto/cluster_secret.h)
  RegistryOptions registry;
  CoordinatorOptions routing;
  RequestLimits limits;
  PublicApiGuards guards;  // API token, per-client and prompt-token limits (its tokenizer: below)
  size_t max_message_bytes = 4u << 20;  // the public API's largest request
  // The serving models' tokenizer.json (a file or a model directory holding one), for
  // cache-aware routing of text prompts; "" = route text prompts on load alone.
  std::string tokenizer;
  // "etcd://HOST:PORT": route the nodes registered in etcd (etcd_node_watch.h), as every
  // coordinator on that etcd does; "" = the nodes registered at control_listen only.
  std::string registry_address;
};

class CoordinatorNode {
 public:
  static absl::StatusOr<std::unique_ptr<CoordinatorNode>> Start(
      const CoordinatorNodeOptions& options);
  ~CoordinatorNode();
  const std::string& address() const { return public_.address; }
  const std::string& control_address() const { return control_.address; }
  NodeRegistry& registry() { return *registry_; }
  // Calls to the node whose control plane is at `address` go over `channel` (see
  // CoordinatorInferenceService::UseChannel).
  void UseChannel(const std::string& address, std::shared_ptr<grpc::Channel> channel) {
    inference_->UseChannel(address, std::move(channel));
  }
  void Shutdown(absl::Duration grace);
  // What its HTTP listener serves: the OpenAI-compatible API (openai_api.h) over the public
  // API, /health (the public API's Health), /metrics (scd:* with role="coordinator").
  std::shared_ptr<HttpHandler> http_handler() const { return http_; }
  MetricsRegistry& metrics() { return metrics_; }

 private:
  CoordinatorNode() = default;
  Tally counters_;
  MetricsRegistry metrics_{{{"role", "coordinator"}}};
  std::unique_ptr<ServingMetrics> serving_metrics_;
  std::shared_ptr<HttpHandler> http_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::optional<ChatTemplate> chat_template_;  // the tokenizer directory's, when it has one
  std::unique_ptr<NodeRegistry> registry_;
  std::unique_ptr<EtcdNodeWatch> etcd_watch_;  // after registry_: stops first
  std::unique_ptr<RegistryService> registry_service_;
  std::unique_ptr<CoordinatorInferenceService> inference_;
  std::unique_ptr<CheckedInferenceService> checked_;
  GrpcServer public_, control_;
};

}  // namespace scd::coordinator

#endif  // SCD_COORDINATOR_COORDINATOR_NODE_H_
