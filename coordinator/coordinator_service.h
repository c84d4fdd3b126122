// The coordinator's services: scd.v1.Registry (leases over NodeRegistry, swept every
// sweep_interval so a silent node leaves routing within lease + sweep) and the public
// scd.v1.Inference: Generate routes the request (NodeRegistry::Resolve: NOT_FOUND for an unknown
// target, naming the known ones), asks every target consumer to admit and run it
// (scd.v1.Consumer.Decode), then, once they have all started, asks the producer to prefill once
// for all of them (scd.v1.Producer.Prefill), and forwards every consumer's events to the client,
// tagged by target. Each target ends in exactly one terminal event: the consumer's, or an Error
// the coordinator writes when the consumer's stream ends without one (consumer lost, or a producer
// that never opened the target's session). A client that cancels cancels every consumer call.
// Control plane: the Registry service checks the cluster secret on every call (UNAUTHENTICATED
// without it); the Inference service attaches it to every call it makes to the nodes. A request
// is tagged for the nodes with a fresh random session id, never the client's request_id; a
// request_id the client left empty is a random one too. Client values reach logs escaped and cut
// (base/log_text.h). When every target refuses before starting (bad input for its model, full),
// the call ends with that refusal's status and no event (a request refused as a whole). Served
// behind CheckedInferenceService, which validates the request before it gets here. Generate is
// routing (the mode parsed here, at the edge) and a RoutedRequest (coordinator/routed_request.h)
// that owns the rest.
// Thread-safety: thread-safe. Threads: none per request -- Generate is served on gRPC's callback
// API and a routed request's target calls, Prefill and timers are callbacks too (gRPC's own
// threads run them); the registry's sweeper is one thread.
#ifndef SCD_COORDINATOR_COORDINATOR_SERVICE_H_
#define SCD_COORDINATOR_COORDINATOR_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "base/tally.h"
#include "coordinator/node_prober.h"
#include "coordinator/node_registry.h"
#include "coordinator/resume_book.h"
#include "proto/cluster_secret.h"
#include "scd/v1/control.grpc.pb.h"
#include "scd/v1/inference.grpc.pb.h"
#include "scd/v1/registry.grpc.pb.h"
#include "serving/checked_inference.h"
#include "serving/serving_metrics.h"
#include "tokenizer/tokenizer.h"

namespace scd::coordinator {

class RegistryService final : public v1::Registry::Service {
 public:
  // Starts the sweep thread; REQUIRES: `registry` and `counters` outlive the service.
  RegistryService(NodeRegistry* registry, ClusterSecret secret, const Tally* counters);
  ~RegistryService() override;

  grpc::Status Register(grpc::ServerContext*, const v1::RegisterRequest* request,
                        v1::RegisterResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse*) override;
  grpc::Status Deregister(grpc::ServerContext*, const v1::DeregisterRequest* request,
                          v1::DeregisterResponse*) override;
  // Live nodes and the coordinator's counters (refusals, routed requests).
  grpc::Status Stats(grpc::ServerContext*, const v1::StatsRequest*, v1::NodeStats*) override;
  // What Stats answers, without the secret check (the node's /metrics collector).
  void FillStats(v1::NodeStats* stats) const;
  // Sets or reads the link shape of the matched producers (registry.proto): one
  // Producer.SetLinkShape per producer, in parallel, each within 5 s.
  grpc::Status SetLinkShape(grpc::ServerContext*, const v1::SetLinkShapeRequest* request,
                            v1::SetLinkShapeResponse* response) override;

 private:
  NodeRegistry* const registry_;
  const ClusterSecret secret_;
  const Tally* const counters_;
  // Expires lapsed leases every sweep_interval on the registry's clock.
  Clock::Ticker sweeper_;
};

struct CoordinatorOptions {
  absl::Duration default_deadline = absl::Seconds(60);
  // After a producer reports a target failed, how long a consumer allowed to fall back may take
  // to announce it (a second Started on Consumer.Decode) before the coordinator cancels it and
  // writes the Error (without fallback: at once). Once announced, the fallback runs to its end.
  absl::Duration failed_target_grace = absl::Seconds(2);
  // Early prefill (coordinator/routed_request.h): a single-target transfer's Prefill goes out
  // just before its Decode instead of after the consumer's Started (a refused request then costs
  // the producer a cancelled prefill; a consumer that would queue it declines it, and the
  // Prefill goes again once the request is admitted). Off: the producer never works for a
  // request before its consumer answered.
  bool early_prefill = true;
  // How many times a target's stream may move to another replica when the one serving it dies
  // or fails it with a retryable error (coordinator/routed_request.h; a request may ask for
  // fewer with GenerateRequest.migration_limit). 0: streams never move.
  uint32_t migration_limit = 3;
  // Resumes (GenerateRequest.resume_token) one tenant (cache_salt) may make per minute here.
  uint32_t max_resumes_per_tenant_per_minute = 60;
  // Cache-aware routing of text prompts: the serving models' shared tokenizer (not owned; null:
  // text prompts are routed on load alone, prompt_ids on their prefix blocks always).
  const Tokenizer* tokenizer = nullptr;
  // The public API's metrics (not owned; null: none recorded).
  ServingMetrics* metrics = nullptr;
};

class CoordinatorInferenceService final : public InferenceBackend {
 public:
  // REQUIRES: `registry` and `counters` outlive the service. `secret`: what the nodes' control
  // planes expect. `counters` gets "refused_<code>" and "routed".
  CoordinatorInferenceService(NodeRegistry* registry, ClusterSecret secret, Tally* counters,
                              CoordinatorOptions options = {});
  ~CoordinatorInferenceService() override;

  EventStream* Generate(grpc::CallbackServerContext* context, v1::GenerateRequest request,
                        EventStream::Ended ended) override;
  grpc::Status ListModels(v1::ListModelsResponse* response) override;
  grpc::Status Health(v1::HealthResponse* response) override;

  // Calls to nodes at `address` go over `channel` (an in-process channel to a node served by this
  // process: `scd serve --all-in-one` spares every token event a TCP round through the kernel).
  void UseChannel(const std::string& address, std::shared_ptr<grpc::Channel> channel);
  // A new channel to the node at `address` as this service makes them: keepalive pings every
  // kNodeKeepalive, a node silent for kNodeKeepaliveTimeout fails its calls (node_ejection.h).
  static std::shared_ptr<grpc::Channel> NodeChannel(const std::string& address);

 private:
  std::shared_ptr<grpc::Channel> Channel(const std::string& address);
  // A resume's checks before any work (resume_token.h, resume_book.h): the request made the
  // original (its id, the token's mode, resume fields cleared), the ids received and the
  // deadline carried; or the refusal.
  struct Resumed {
    std::vector<int32_t> received;
    absl::Time deadline;
    TransferMode mode = TransferMode::kLocal;  // the mode the stream started in
  };
  absl::StatusOr<Resumed> CheckResume(const grpc::CallbackServerContext& context,
                                      v1::GenerateRequest* req);
  // Tells `target`'s consumer that the producer will not send (or finish) its session
  // (Consumer.TransferFailed), so it falls back now; a consumer that cannot be told is left to
  // the grace period. `id`: the request, for logs. Returns at once (the call is asynchronous).
  void TellTransferFailed(const RouteTarget& target, const std::string& session_id,
                          const std::string& reason, const std::string& id);

  NodeRegistry* const registry_;
  const ClusterSecret secret_;
  Tally* const counters_;
  const CoordinatorOptions options_;
  std::atomic<uint32_t> active_{0};
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_ ABSL_GUARDED_BY(mu_);
  ResumeBook resumes_;  // once per position, per-tenant rate (resume_book.h)
  // Probes the nodes its requests' failed calls took out of routing (node_ejection.h).
  std::unique_ptr<NodeProber> prober_;
};

}  // namespace scd::coordinator

#endif  // SCD_COORDINATOR_COORDINATOR_SERVICE_H_
