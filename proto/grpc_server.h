// Starting a gRPC server the way every node does: insecure credentials on `listen` ("HOST:PORT";
// port 0 picks a free one), the given services, and the address it actually bound.
// Thread-safety: stateless function.
#ifndef SCD_PROTO_GRPC_SERVER_H_
#define SCD_PROTO_GRPC_SERVER_H_

#include <grpcpp/server.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace scd {

struct GrpcServer {
  std::unique_ptr<grpc::Server> server;
  std::string address;  // HOST:PORT as bound
};

// UNAVAILABLE naming `listen` when it cannot listen there. REQUIRES: the services outlive the
// server.
absl::StatusOr<GrpcServer> StartGrpcServer(const std::string& listen,
                                           const std::vector<grpc::Service*>& services);

}  // namespace scd

#endif  // SCD_PROTO_GRPC_SERVER_H_
