// "host:port" addresses, parsed and written once for every backend and service: "127.0.0.1:80",
// "node-1:0" (port 0: any free one), "[::1]:9000" and ":9000" (an empty host: every interface).
// Thread-safety: stateless functions.
#ifndef SCD_BASE_HOST_PORT_H_
#define SCD_BASE_HOST_PORT_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace scd {

struct HostPort {
  std::string host;  // without brackets ("::1"); empty = every interface
  uint16_t port = 0;
  // "host:port", an IPv6 host in brackets ("[::1]:9000").
  std::string ToString() const;
  // 0.0.0.0, ::, or empty.
  bool wildcard() const;
};

// InvalidArgument naming the address for anything that is not host:port with a port in 0..65535
// (no colon, a non-numeric or out-of-range port, an unbalanced bracket).
absl::StatusOr<HostPort> ParseHostPort(absl::string_view address);

// OK for an IPv4 or IPv6 address (IPv6 with or without brackets) or an RFC 1123 host name
// ("node-1", "scd-etcd.scd.svc"); InvalidArgument naming `what` and the text otherwise -- with a
// hint when it holds an unexpanded "$(VAR)" (Kubernetes leaves a variable the container does not
// define as written).
absl::Status CheckHost(absl::string_view host, absl::string_view what);

}  // namespace scd

#endif  // SCD_BASE_HOST_PORT_H_
