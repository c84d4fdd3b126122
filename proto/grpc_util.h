// Small gRPC helpers every service and client shares: status conversion both ways (same code,
// same message), the address a server listening on HOST:0 actually bound, and the address other
// nodes should dial for it.
// Thread-safety: stateless functions.
#ifndef SCD_PROTO_GRPC_UTIL_H_
#define SCD_PROTO_GRPC_UTIL_H_

#include <grpcpp/support/status.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/host_port.h"

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
  absl::StatusOr<HostPort> hp = ParseHostPort(listen);
  if (!hp.ok()) return absl::StrCat(listen.substr(0, listen.rfind(':')), ":", port);
  hp->port = static_cast<uint16_t>(port);
  return hp->ToString();
}

// A call's gRPC deadline (ServerContextBase::deadline(): the client's, as this server received
// it) as a time; InfiniteFuture when the call has none.
inline absl::Time FromGrpcDeadline(std::chrono::system_clock::time_point deadline) {
  if (deadline == std::chrono::system_clock::time_point::max()) return absl::InfiniteFuture();
  return absl::FromChrono(deadline);
}

// The address other nodes should dial for a server bound at `bound` ("HOST:PORT"): the port with
// `advertise_host` when given; else, when HOST is a wildcard (0.0.0.0, ::, [::], empty), the
// machine's host name; else `bound` itself.
inline std::string AdvertisedAddress(const std::string& bound, const std::string& advertise_host) {
  absl::StatusOr<HostPort> hp = ParseHostPort(bound);
  if (!hp.ok()) return bound;
  if (!advertise_host.empty()) {
    // "[::1]" or "::1": ToString puts the brackets back.
    absl::string_view host = advertise_host;
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
      host = host.substr(1, host.size() - 2);
    }
    return HostPort{std::string(host), hp->port}.ToString();
  }
  if (hp->wildcard()) {
    char name[256] = {};
    if (gethostname(name, sizeof(name) - 1) == 0 && name[0] != '\0') {
      return HostPort{name, hp->port}.ToString();
    }
  }
  return bound;
}

}  // namespace scd

#endif  // SCD_PROTO_GRPC_UTIL_H_
