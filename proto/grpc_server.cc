#include "proto/grpc_server.h"

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>

#include "absl/strings/str_cat.h"
#include "proto/grpc_util.h"

namespace scd {

absl::StatusOr<GrpcServer> StartGrpcServer(const std::string& listen,
                                           const std::vector<grpc::Service*>& services) {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  for (grpc::Service* service : services) builder.RegisterService(service);
  GrpcServer started;
  started.server = builder.BuildAndStart();
  if (started.server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen));
  }
  started.address = BoundAddress(listen, port);
  return started;
}

}  // namespace scd
