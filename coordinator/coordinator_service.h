// The coordinator's services: scd.v1.Registry (leases over NodeRegistry, swept every
// sweep_interval so a silent node leaves routing within lease + sweep) and the public
// scd.v1.Inference: Generate routes the request (NodeRegistry::Resolve: NOT_FOUND for an unknown
// target, naming the known ones), asks every target consumer to admit and run it
// (scd.v1.Consumer.Decode), then, once they have all started, asks the producer to prefill once
// for all of them (scd.v1.Producer.Prefill), and forwards every consumer's events to the client,
// tagged by target. Each target ends in exactly one terminal event: the consumer's, or an Error
// the coordinator writes when the consumer's stream ends without one (consumer lost, or a producer
// that never opened the target's session). A client that cancels cancels every consumer call.
// Thread-safety: thread-safe; gRPC's sync server runs each call on its own thread.
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
#include "coordinator/node_registry.h"
#include "proto/scd/v1/control.grpc.pb.h"
#include "proto/scd/v1/inference.grpc.pb.h"
#include "proto/scd/v1/registry.grpc.pb.h"

namespace scd::coordinator {

class RegistryService final : public v1::Registry::Service {
 public:
  // Starts the sweep thread; REQUIRES: `registry` outlives the service.
  explicit RegistryService(NodeRegistry* registry);
  ~RegistryService() override;

  grpc::Status Register(grpc::ServerContext*, const v1::RegisterRequest* request,
                        v1::RegisterResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse*) override;
  grpc::Status Deregister(grpc::ServerContext*, const v1::DeregisterRequest* request,
                          v1::DeregisterResponse*) override;

 private:
  NodeRegistry* const registry_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread sweeper_;
};

struct CoordinatorOptions {
  absl::Duration default_deadline = absl::Seconds(60);
  // After a producer reports a target failed, how long a consumer allowed to fall back may take
  // to announce it (a second Started on Consumer.Decode) before the coordinator cancels it and
  // writes the Error (without fallback: at once). Once announced, the fallback runs to its end.
  absl::Duration failed_target_grace = absl::Seconds(2);
};

class CoordinatorInferenceService final : public v1::Inference::Service {
 public:
  // REQUIRES: `registry` outlives the service.
  CoordinatorInferenceService(NodeRegistry* registry, CoordinatorOptions options = {});

  grpc::Status Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateEvent>* writer) override;
  grpc::Status ListModels(grpc::ServerContext*, const v1::ListModelsRequest*,
                          v1::ListModelsResponse* response) override;
  grpc::Status Health(grpc::ServerContext*, const v1::HealthRequest*,
                      v1::HealthResponse* response) override;

 private:
  std::shared_ptr<grpc::Channel> Channel(const std::string& address);

  NodeRegistry* const registry_;
  const CoordinatorOptions options_;
  std::atomic<uint64_t> next_request_{1};
  std::atomic<uint32_t> active_{0};
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_ ABSL_GUARDED_BY(mu_);
};

}  // namespace scd::coordinator

#endif  // SCD_COORDINATOR_COORDINATOR_SERVICE_H_
