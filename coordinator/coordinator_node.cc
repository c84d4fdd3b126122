#include "coordinator/coordinator_node.h"

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "proto/grpc_server.h"

namespace scd::coordinator {

absl::StatusOr<std::unique_ptr<CoordinatorNode>> CoordinatorNode::Start(
    const CoordinatorNodeOptions& options) {
  std::unique_ptr<CoordinatorNode> node(new CoordinatorNode());
  node->registry_ = std::make_unique<NodeRegistry>(options.registry);
  node->registry_service_ = std::make_unique<RegistryService>(node->registry_.get());
  node->inference_ =
      std::make_unique<CoordinatorInferenceService>(node->registry_.get(), options.routing);
  SCD_ASSIGN_OR_RETURN(
      GrpcServer grpc_server,
      StartGrpcServer(options.listen, {node->registry_service_.get(), node->inference_.get()}));
  node->server_ = std::move(grpc_server.server);
  node->address_ = grpc_server.address;
  spdlog::info("coordinator serving on {}", node->address_);
  return node;
}

void CoordinatorNode::Shutdown(absl::Duration grace) {
  if (server_) server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  server_.reset();
}

CoordinatorNode::~CoordinatorNode() { Shutdown(absl::ZeroDuration()); }

}  // namespace scd::coordinator
