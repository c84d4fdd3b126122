// Small gRPC helpers every service and client shares: status conversion both ways (same code,
// same message) and the address a server listening on HOST:0 actually bound.
// Thread-safety: stateless functions.
#ifndef SCD_PROTO_GRPC_UTIL_H_
#define SCD_PROTO_GRPC_UTIL_H_

#include <grpcpp/support/status.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace scd {

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

inline absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

// "HOST:PORT" for a server asked to listen on `listen` ("HOST:0" or "HOST:N") that bound `port`.
inline std::string BoundAddress(const std::string& listen, int port) {
  return absl::StrCat(listen.substr(0, listen.rfind(':')), ":", port);
}

}  // namespace scd

#endif  // SCD_PROTO_GRPC_UTIL_H_
