// grpc.health.v1.Health (gRPC's standard health checking protocol) for one of a node's gRPC
// ports: Check answers the status now, Watch streams it and each change. "" is the node as a
// whole; the names given at construction (the port's services, e.g. "scd.v1.Inference") share its
// status; any other name is NOT_FOUND (Check) or SERVICE_UNKNOWN (Watch). A node is NOT_SERVING
// while it loads and once it drains, SERVING in between (SetServing). It needs no cluster secret:
// the one call on a control port that does not (probes carry none). Watch streams are capped per
// port (`max_watches`; beyond it RESOURCE_EXHAUSTED): each holds no thread (gRPC's callback API)
// but holds a call. EndWatches finishes them (UNAVAILABLE) before the server stops, so a stop
// does not wait out its deadline for streams that never end on their own.
// Thread-safety: every method may be called from any thread.
#ifndef SCD_PROTO_HEALTH_SERVICE_H_
#define SCD_PROTO_HEALTH_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace scd {

inline constexpr char kHealthServiceName[] = "grpc.health.v1.Health";
inline constexpr int kDefaultMaxHealthWatches = 32;

class HealthService final : public grpc::health::v1::Health::CallbackService {
 public:
  using ServingStatus = grpc::health::v1::HealthCheckResponse::ServingStatus;

  // Starts NOT_SERVING.
  explicit HealthService(std::vector<std::string> services,
                         int max_watches = kDefaultMaxHealthWatches);
  ~HealthService() override;
  HealthService(const HealthService&) = delete;
  HealthService& operator=(const HealthService&) = delete;

  // SERVING or NOT_SERVING from now on; every Watch hears of a change.
  void SetServing(bool serving);
  bool serving() const;
  // Finishes every Watch (UNAVAILABLE) and refuses new ones; Check still answers.
  void EndWatches();
  int watches() const;

  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* context,
                                  const grpc::health::v1::HealthCheckRequest* request,
                                  grpc::health::v1::HealthCheckResponse* response) override;
  grpc::ServerWriteReactor<grpc::health::v1::HealthCheckResponse>* Watch(
      grpc::CallbackServerContext* context,
      const grpc::health::v1::HealthCheckRequest* request) override;

 private:
  class Watcher;
  bool Knows(const std::string& service) const;
  void Remove(Watcher* watcher);

  const std::vector<std::string> services_;
  const int max_watches_;
  mutable absl::Mutex mu_;
  bool serving_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  std::set<Watcher*> watchers_ ABSL_GUARDED_BY(mu_);
  absl::CondVar none_left_;
};

}  // namespace scd

#endif  // SCD_PROTO_HEALTH_SERVICE_H_
