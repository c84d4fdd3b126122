// One Generate on the coordinator, from routed to done. It owns the request's state: the route's
// load on the registry and one in the service's active count (held from construction to
// destruction: every exit releases them), one call per target, the producer's outcome. Run():
//   fan-out   every target's Consumer.Decode starts at once (its reader forwards its events:
//             TargetForwarder, one writer lock for the client's stream);
//   refusal   every target refused before starting: the request is refused as a whole;
//   prefill   one Producer.Prefill for the targets that take codes (a child of the client's call,
//             so a client that goes away cancels it and its sessions while it runs);
//   settle    a target the producer failed is told (Consumer.TransferFailed) and given the grace to
//             announce a fallback; else cancelled, and its Error written;
//   end       every target's terminal event written; the readers joined.
// The request has one cancellation (base/cancellation.h): the client going away cancels it (the
// sync handler's watch) and its callback cancels every target's call; the producer's Prefill, a
// child of the client's call, is cancelled with it by gRPC.
// Thread-safety: Run is called once, on the handler's thread; the readers share the state under
// one mutex.
#ifndef SCD_COORDINATOR_ROUTED_REQUEST_H_
#define SCD_COORDINATOR_ROUTED_REQUEST_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/cancellation.h"
#include "coordinator/node_registry.h"
#include "coordinator/target_forwarder.h"
#include "proto/cluster_secret.h"
#include "proto/serving_metrics.h"
#include "scd/v1/inference.pb.h"

namespace scd::coordinator {

// What a routed request uses of its service (none owned; all outlive the request).
struct RoutedRequestDeps {
  NodeRegistry* registry = nullptr;
  const ClusterSecret* secret = nullptr;  // attached to every call to a node
  std::function<std::shared_ptr<grpc::Channel>(const std::string& address)> channel;
  ServingMetrics* metrics = nullptr;        // null: none recorded
  std::atomic<uint32_t>* active = nullptr;  // the service's count of requests running
  // After the producer failed a target, how long its consumer may take to announce a fallback.
  absl::Duration failed_target_grace = absl::Seconds(2);
  // Tells a target's consumer that its transfer failed (Consumer.TransferFailed).
  std::function<void(const RouteTarget& target, const std::string& session_id,
                     const std::string& reason)>
      tell_failed;
};

class RoutedRequest {
 public:
  // `req` has its request id; `route` was resolved for it with `hint`.
  RoutedRequest(RoutedRequestDeps deps, v1::GenerateRequest req, Route route,
                const PrefixHint* hint, absl::Time deadline, grpc::ServerContext* context,
                grpc::ServerWriter<v1::GenerateEvent>* writer);
  ~RoutedRequest();
  RoutedRequest(const RoutedRequest&) = delete;
  RoutedRequest& operator=(const RoutedRequest&) = delete;

  // The status Generate returns: the first refusal when every target refused before starting,
  // else OK with every target's terminal event written.
  grpc::Status Run();

 private:
  struct TargetCall;
  void StartTargets();
  void ReadTarget(TargetCall* call, v1::DecodeRequest decode);
  // Waits until `done` holds for every call (a cancellation ends them all).
  void WaitAll(const std::function<bool(const TargetCall&)>& done);
  // After every target started or ended: the whole request's refusal, if every one refused.
  std::optional<grpc::Status> Refusal();
  // The producer's Prefill for the targets that take codes; returns the targets it failed.
  std::vector<TargetCall*> Prefill();
  void Settle(const std::vector<TargetCall*>& failed);
  void Write(const v1::GenerateEvent& event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The Error a target gets when its Decode call ended without a terminal event.
  void EndWithoutTerminal(TargetCall* call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void JoinReaders();

  const RoutedRequestDeps deps_;
  const v1::GenerateRequest req_;
  const Route route_;
  const std::string id_;          // for logs
  const std::string session_id_;  // the producer's sessions to the targets
  const absl::Time routed_at_;    // where the predictions' clocks start
  const absl::Time deadline_;
  grpc::ServerContext* const context_;
  grpc::ServerWriter<v1::GenerateEvent>* const writer_;
  ServingMetrics::Call metrics_;
  Cancellation cancellation_;
  absl::Mutex mu_;  // the calls' state, the producer's outcome and the writer
  ProducerOutcome producer_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<TargetCall>> calls_;
  // Cancels every target's call (TryCancel is safe from any thread, before the call starts too).
  Cancellation::Registration cancel_calls_;
};

}  // namespace scd::coordinator

#endif  // SCD_COORDINATOR_ROUTED_REQUEST_H_
