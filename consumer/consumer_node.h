// ConsumerNode: everything one scd-consumer process runs, assembled from options: the model and
// its tokenizer, the translator artifacts it holds (checked against its model at load), the
// transfer listener producers stream to (SessionRouter), admission by KV memory with its queue,
// the decode scheduler (continuous batching), two gRPC servers, one per
// plane: the public Inference API (checked in front) on `listen` and the control-plane Consumer
// service (cluster secret on every call) on `control_listen`, and the registration with the
// coordinator (its control address). tools/scd_consumer_main.cc is flags -> ConsumerNodeOptions -> Start.
// Thread-safety: Drain and Shutdown may be called from any one thread.
#ifndef SCD_CONSUMER_CONSUMER_NODE_H_
#define SCD_CONSUMER_CONSUMER_NODE_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/http_server.h"
#include "base/metrics.h"
#include "base/work_queue.h"
#include "codec/artifact.h"
#include "codec/served_model_spec.h"
#include "consumer/admission.h"
#include "consumer/decode_scheduler.h"
#include "consumer/decode_service.h"
#include "consumer/inference_service.h"
#include "consumer/session_router.h"
#include "proto/grpc_server.h"
#include "proto/node_speeds.h"
#include "proto/registry_client.h"
#include "serving/checked_inference.h"
#include "serving/serving_metrics.h"

namespace scd::consumer {

struct ConsumerNodeOptions {
  ServedModelSpec model;  // a model directory or dummy weights, and the routing name
  std::string listen = "127.0.0.1:0";          // public Inference API
  std::string control_listen = "127.0.0.1:0";  // Consumer control (the coordinator calls it)
  std::string cluster_secret;                  // required (proto/cluster_secret.h)
  // Host other nodes dial (registered with the coordinator); "" = the listen host, or the
  // machine's host name when listening on a wildcard (0.0.0.0).
  std::string advertise;
  std::string transfer_listen = "127.0.0.1:0";
  std::string transport = "grpc";      // grpc | ucx (what producers stream over)
  std::string coordinator;             // its control address; "" = standalone (no registration)
  std::vector<std::string> artifacts;  // artifact files, one per producer it accepts
  // An artifact fitted at another weight precision than this node serves (codec/artifact.h,
  // CheckConsumerPrecision) is refused unless this is set; then it is served with a warning.
  bool allow_precision_mismatch = false;
  uint32_t capacity = 16;              // requests holding KV memory at once (an upper bound)
  // KV memory requests reserve (prompt + max_tokens positions each); 0: room for `capacity`
  // requests of the model's whole context, at most half the machine's memory.
  double kv_cache_mb = 0;
  uint32_t max_queued = 256;           // requests waiting for KV memory at once (0: refuse)
  int64_t max_batched_tokens = 512;    // rows of one batched step (decodes + prefill chunks)
  int scheduler_nice = 10;  // how much nicer the decode loop's thread runs (SchedulerOptions::nice)
  // Threads running requests' steps (their start, taking transfer chunks: CRC, unframing): fixed,
  // whatever the number of requests (ConsumerModel::steps).
  int step_threads = 2;
  absl::Duration transfer_timeout = absl::Seconds(30);  // a transfer's longest stall
  size_t prefix_cache_mb = 0;          // the prefix cache's budget (0: off)
  uint32_t default_max_tokens = 128;
  RequestLimits limits;            // its public API's bounds
  PublicApiGuards guards;          // API token, per-client and prompt-token limits
  size_t max_message_bytes = 4u << 20;
};

class ConsumerNode {
 public:
  static absl::StatusOr<std::unique_ptr<ConsumerNode>> Start(const ConsumerNodeOptions& options);
  ~ConsumerNode();

  const std::string& name() const { return name_; }
  const std::string& address() const { return public_.address; }
  const std::string& control_address() const { return control_server_.address; }
  const std::string& transfer_address() const { return router_->address(); }
  const std::string& fingerprint() const { return fingerprint_; }
  // A channel to its control plane inside this process (for a coordinator in the same process).
  std::shared_ptr<grpc::Channel> InProcessControlChannel() const;
  uint32_t active_requests() const { return admission_->active(); }
  // Takes no new requests and leaves routing; running ones go on.
  void Drain();
  // Drain, wait up to `grace` for running requests, then stop serving.
  void Shutdown(absl::Duration grace);
  // What its HTTP listener serves: /metrics (scd:* with role="consumer", model=NAME: the public
  // API's and the coordinator's requests it decoded, its Stats, each artifact's calibrated KL as
  // scd:artifact_calibrated_kl) and /health ("draining" once draining).
  std::shared_ptr<HttpHandler> http_handler() const { return http_; }

 private:
  ConsumerNode() = default;
  static void SetUpMetrics(ConsumerNode* node);
  // Loads the artifacts at `paths` (each fitted for this node's model) into node->artifacts_,
  // named in `registration` and `held` by id.
  static absl::Status LoadArtifacts(const ConsumerNodeOptions& options, ConsumerNode* node,
                                    v1::RegisterRequest* registration,
                                    std::map<std::string, const Artifact*>* held);
  // The model as its requests see it: the scheduler, the step queue and the prefix cache made
  // (node->scheduler_, steps_, prefix_cache_).
  static ConsumerModel ServingModel(const ConsumerNodeOptions& options, ConsumerNode* node);
  // Registers with options.coordinator and starts the heartbeats (node->registration_).
  static void Register(const ConsumerNodeOptions& options, v1::RegisterRequest registration,
                       int64_t kv_budget_bytes, int64_t kv_bytes_per_token, ClusterSecret secret,
                       ConsumerNode* node);

  std::unique_ptr<MetricsRegistry> metrics_;  // first: outlives everything that records
  NodeSpeedTracker speeds_;  // fed by serving_metrics_, reported with every heartbeat
  std::unique_ptr<ServingMetrics> serving_metrics_;
  std::shared_ptr<HttpHandler> http_;

  std::string name_, fingerprint_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<ConsumerPrefixCache> prefix_cache_;  // null: off
  std::unique_ptr<Tokenizer> tokenizer_;
  std::map<std::string, Artifact> artifacts_;  // by id
  std::shared_ptr<Admission> admission_;
  std::unique_ptr<DecodeScheduler> scheduler_;  // before the services: outlives their calls
  std::unique_ptr<WorkQueue> steps_;            // outlives the sessions that post to it
  std::unique_ptr<transport::Transport> transport_;
  std::unique_ptr<SessionRouter> router_;
  std::unique_ptr<ConsumerInferenceService> inference_;
  std::unique_ptr<ConsumerControlService> control_;
  std::unique_ptr<CheckedInferenceService> checked_;
  GrpcServer public_, control_server_;
  std::unique_ptr<RegistryClient> registration_;
};

}  // namespace scd::consumer

#endif  // SCD_CONSUMER_CONSUMER_NODE_H_
