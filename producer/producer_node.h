// ProducerNode: everything one scd-producer process runs, assembled from options: the model and
// tokenizer, the artifacts it encodes for (checked against its model at load), the transport it
// streams codes over (optionally shaped), the gRPC server with the control-plane Producer
// service (cluster secret on every call; a producer has no public API), and the registration
// with the coordinator. tools/scd_producer_main.cc is flags ->
// ProducerNodeOptions -> Start.
// Thread-safety: Shutdown from any one thread.
#ifndef SCD_PRODUCER_PRODUCER_NODE_H_
#define SCD_PRODUCER_PRODUCER_NODE_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/http_server.h"
#include "base/metrics.h"
#include "codec/artifact.h"
#include "codec/served_model_spec.h"
#include "producer/producer_service.h"
#include "proto/grpc_server.h"
#include "proto/registry_client.h"

namespace scd::producer {

struct ProducerNodeOptions {
  ServedModelSpec model;  // a model directory or dummy weights, and the routing name
  std::string control_listen = "127.0.0.1:0";  // Producer control (the coordinator calls it)
  std::string cluster_secret;                  // required (proto/cluster_secret.h)
  // Host other nodes dial (registered with the coordinator); "" = the listen host, or the
  // machine's host name when listening on a wildcard (0.0.0.0).
  std::string advertise;
  std::string transport = "grpc";      // grpc | ucx
  std::string coordinator;             // its control address; "" = standalone
  std::vector<std::string> artifacts;  // the pairs it encodes for
  double link_gbps = 0;                // shaper on every session (0 = off)
  double link_latency_us = 0;
  size_t max_inflight_mb = 64;  // per session
  size_t prefix_cache_mb = 0;   // the prefix cache's budget (0: off)
  uint32_t capacity = 0;        // prefills at once the router may send it (0: no limit)
  int prefill_threads = 8;      // prefills run at once (ProducerModel::prefill_threads)
};

class ProducerNode {
 public:
  static absl::StatusOr<std::unique_ptr<ProducerNode>> Start(const ProducerNodeOptions& options);
  ~ProducerNode();

  const std::string& name() const { return name_; }
  const std::string& address() const { return server_.address; }
  const std::string& control_address() const { return server_.address; }
  uint64_t prefills() const { return service_->prefills(); }
  ProducerControlService& service() { return *service_; }
  void Shutdown(absl::Duration grace);
  // What its HTTP listener serves: /metrics (its Stats as scd:* with role="producer",
  // model=NAME) and /health.
  std::shared_ptr<HttpHandler> http_handler() const { return http_; }

 private:
  ProducerNode() = default;

  std::unique_ptr<MetricsRegistry> metrics_;
  std::shared_ptr<HttpHandler> http_;

  std::string name_, fingerprint_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::map<std::string, Artifact> artifacts_;
  std::unique_ptr<transport::Transport> transport_;
  std::unique_ptr<ProducerControlService> service_;
  GrpcServer server_;
  std::unique_ptr<RegistryClient> registration_;
};

}  // namespace scd::producer

#endif  // SCD_PRODUCER_PRODUCER_NODE_H_
