// Small gRPC helpers every service and client shares: status conversion both ways (same code,
// same message), the address a server listening on HOST:0 actually bound, and the address other
// nodes should dial for it.
// Thread-safety: stateless functions.
#ifndef SCD_PROTO_GRPC_UTIL_H_
#define SCD_PROTO_GRPC_UTIL_H_

#include <grpcpp/support/status.h>
#include <unistd.h>

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

// The address other nodes should dial for a server bound at `bound` ("HOST:PORT"): the port with
// `advertise_host` when given; else, when HOST is a wildcard (0.0.0.0, ::, [::], empty), the
// machine's host name; else `bound` itself.
inline std::string AdvertisedAddress(const std::string& bound, const std::string& advertise_host) {
  const size_t colon = bound.rfind(':');
  const std::string host = colon == std::string::npos ? "" : bound.substr(0, colon);
  const std::string port = colon == std::string::npos ? bound : bound.substr(colon + 1);
  if (!advertise_host.empty()) return absl::StrCat(advertise_host, ":", port);
  if (host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]") {
    char name[256] = {};
    if (gethostname(name, sizeof(name) - 1) == 0 && name[0] != '\0') {
      return absl::StrCat(name, ":", port);
    }
  }
  return bound;
}

}  // namespace scd

#endif  // SCD_PROTO_GRPC_UTIL_H_
