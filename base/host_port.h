// "host:port" addresses, parsed and written once for every backend and service: "127.0.0.1:80",
// "node-1:0" (port 0: any free one), "[::1]:9000" and ":9000" (an empty host: every interface).
// Thread-safety: stateless functions.
#ifndef SCD_BASE_HOST_PORT_H_
#define SCD_BASE_HOST_PORT_H_

#include <cstdint>
#include <string>

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

}  // namespace scd

#endif  // SCD_BASE_HOST_PORT_H_
