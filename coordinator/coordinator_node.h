// CoordinatorNode: what one scd-coordinator process runs: the node registry (leases), the
// Registry service and the public Inference service on one gRPC server.
// tools/scd_coordinator_main.cc is flags -> CoordinatorNodeOptions -> Start.
// Thread-safety: Shutdown from any one thread.
#ifndef SCD_COORDINATOR_COORDINATOR_NODE_H_
#define SCD_COORDINATOR_COORDINATOR_NODE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/node_registry.h"

namespace scd::coordinator {

struct CoordinatorNodeOptions {
  std::string listen = "127.0.0.1:0";
  RegistryOptions registry;
  CoordinatorOptions routing;
};

class CoordinatorNode {
 public:
  static absl::StatusOr<std::unique_ptr<CoordinatorNode>> Start(
      const CoordinatorNodeOptions& options);
  ~CoordinatorNode();
  const std::string& address() const { return address_; }
  NodeRegistry& registry() { return *registry_; }
  void Shutdown(absl::Duration grace);

 private:
  CoordinatorNode() = default;
  std::string address_;
  std::unique_ptr<NodeRegistry> registry_;
  std::unique_ptr<RegistryService> registry_service_;
  std::unique_ptr<CoordinatorInferenceService> inference_;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace scd::coordinator

#endif  // SCD_COORDINATOR_COORDINATOR_NODE_H_
