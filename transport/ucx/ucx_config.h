// UCX configuration and lanes: how the context is configured (the user's UCX_* variables honoured,
// the quirks of UCX 1.13 worked around), which transports it and each endpoint's lanes use, and
// socket addresses for ucp's sockaddr connection manager.
//
// UCX 1.13 specifics: error mode PEER excludes transports without peer-failure support from the AM
// lane (posix, sysv, self) and requires memory invalidation from rendezvous lanes, and the
// sockaddr connection manager needs a transport on the network device the address resolves to. So
// a same-host link runs its AM lane over tcp and its rendezvous over cma (enabled with
// CMA_MEMORY_INVALIDATE=y), and a UCX_TLS without a network transport (posix,cma,self) gets tcp
// added for connection setup and the AM lane.
// Thread-safety: stateless functions.
#ifndef SCD_TRANSPORT_UCX_UCX_CONFIG_H_
#define SCD_TRANSPORT_UCX_UCX_CONFIG_H_

#include <sys/socket.h>
#include <ucp/api/ucp.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "transport/transport.h"

namespace scd::transport::ucx_internal {

std::string UcsError(ucs_status_t status);

// Applies the backend's settings to a ucp config read from the environment: tcp added to a
// shared-memory-only UCX_TLS, CMA_MEMORY_INVALIDATE=y where cma may be used, no tcp PUT and no
// zero-copy sends where tcp may be used (UCX 1.13's tcp aborts a survivor of a peer that closed
// mid-transfer otherwise; larger tcp segments instead), endpoint keepalive from `options`. The
// user's own UCX_* variables win. Logs what it changed, once per process.
void ConfigureContext(ucp_config_t* config, const TransportOptions& options);

// True for a UCX_TLS list that names no transport ucp's sockaddr connection manager can resolve
// an IP address to (an exclusion list "^..." or "all" keeps the network transports).
bool LacksNetworkTransport(absl::string_view tls);
// Whether a UCX_TLS value (null: unset) may enable the cma transport; the tcp transport (also
// where ConfigureContext adds it).
bool MayUseCma(const char* tls);
bool MayUseTcp(const char* tls);

// The transports the context uses ("tcp", "cma", ...), from ucp_context_print_info.
std::vector<std::string> ContextTransports(ucp_context_h context);
// The transports of an endpoint's lanes, from ucp_ep_print_info ("lane[1]:  1:tcp/lo.0 ...").
std::vector<std::string> EndpointLanes(ucp_ep_h ep);
// What the transports can do: rdma (an RDMA transport among them), gpu_memory (cuda/rocm/gdr).
void FillCapabilities(const std::vector<std::string>& transports, Capabilities* capabilities);

// A resolved socket address.
struct SockAddr {
  sockaddr_storage storage{};
  socklen_t length = 0;
  std::string host;  // as the caller wrote it
};
// "host:port" (base/host_port.h) resolved for listening (`passive`) or connecting.
absl::StatusOr<SockAddr> ResolveAddress(const std::string& address, bool passive);
std::string FormatSockAddr(const sockaddr* addr);
uint16_t SockAddrPort(const sockaddr* addr);

}  // namespace scd::transport::ucx_internal

#endif  // SCD_TRANSPORT_UCX_UCX_CONFIG_H_
