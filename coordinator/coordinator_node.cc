#include "coordinator/coordinator_node.h"

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proto/grpc_util.h"

namespace scd::coordinator {

absl::StatusOr<std::unique_ptr<CoordinatorNode>> CoordinatorNode::Start(
    const CoordinatorNodeOptions& options) {
  std::unique_ptr<CoordinatorNode> node(new CoordinatorNode());
  node->registry_ = std::make_unique<NodeRegistry>(options.registry);
  node->registry_service_ = std::make_unique<RegistryService>(node->registry_.get());
  node->inference_ =
      std::make_unique<CoordinatorInferenceService>(node->registry_.get(), options.routing);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.listen, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(node->registry_service_.get());
  builder.RegisterService(node->inference_.get());
  node->server_ = builder.BuildAndStart();
  if (node->server_ == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen));
  }
  node->address_ = BoundAddress(options.listen, port);
  spdlog::info("coordinator serving on {}", node->address_);
  return node;
}

void CoordinatorNode::Shutdown(absl::Duration grace) {
  if (server_) server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  server_.reset();
}

CoordinatorNode::~CoordinatorNode() { Shutdown(absl::ZeroDuration()); }

}  // namespace scd::coordinator
