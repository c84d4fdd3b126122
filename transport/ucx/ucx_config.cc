#include "transport/ucx/ucx_config.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/host_port.h"

namespace scd::transport::ucx_internal {
namespace {

absl::StatusOr<SockAddr> Resolve(const std::string& host, uint16_t port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* result = nullptr;
  std::string service = std::to_string(port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &result);
  if (rc != 0 || result == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve '", host, "': ", gai_strerror(rc)));
  }
  SockAddr out;
  std::memcpy(&out.storage, result->ai_addr, result->ai_addrlen);
  out.length = result->ai_addrlen;
  freeaddrinfo(result);
  return out;
}

// Sets `key` (ucp's name, or a UCT component's without its prefix: ucp hands unknown keys on)
// to `value` unless the environment sets `variable` (the user's own setting wins).
void SetUnlessUserSet(ucp_config_t* config, const char* variable, const char* key,
                      const std::string& value) {
  if (std::getenv(variable) != nullptr) return;
  const ucs_status_t status = ucp_config_modify(config, key, value.c_str());
  if (status != UCS_OK) {
    spdlog::warn("ucx: cannot set {}={}: {}", variable, value, UcsError(status));
  } else {
    spdlog::debug("ucx: {}={}", variable, value);
  }
}

// Whether a UCX_TLS value (null: unset) names one of `names` (or excludes none of them).
bool Names(const char* tls, std::initializer_list<absl::string_view> names) {
  if (tls == nullptr) return true;
  absl::string_view list = tls;
  const bool exclude = absl::ConsumePrefix(&list, "^");
  bool named = false;
  for (absl::string_view tl : absl::StrSplit(list, ',')) {
    tl = absl::StripAsciiWhitespace(tl);
    absl::ConsumePrefix(&tl, "\\");
    named |= std::find(names.begin(), names.end(), tl) != names.end();
  }
  return exclude ? !named : named;
}

// UCX 1.13's tcp transport aborts a process (assertions built in: Debian's libuct) when its peer
// goes away while a zero-copy send or a PUT is in flight: a PUT's ack read after the disconnect
// cleared its flag (tcp_ep.c:939 `ep->flags & UCT_TCP_EP_FLAG_PUT_TX_WAITING_ACK`), a zero-copy
// send's completion called again by the purge (uct_iface.h:884 `comp->count > 0`, status
// ENDPOINT_TIMEOUT). Both paths are still in UCX's master. `link_contract_test`'s
// CloseReachesBothHandlersOnce over ucx_tcp, repeated beside two CPU hogs, aborted within 1-10 s
// (2-48 repeats); with PUT off (rendezvous data goes as active messages) and no zero-copy (sends
// copy into tcp's segment buffers) it ran 391 repeats in 120 s. Segments of 256 KiB (UCX: 8 KiB
// out, 64 KiB in) keep the copies few: loopback goodput 1.5-1.6 GiB/s against 1.7-1.8 with zero
// copy in the same minute (0.7-0.9 with 8 KiB segments). Same-host bulk data still moves by cma (a
// get, no tcp PUT). The user's own UCX_* settings win.
void KeepTcpOffZeroCopy(ucp_config_t* config) {
  SetUnlessUserSet(config, "UCX_TCP_PUT_ENABLE", "PUT_ENABLE", "n");
  SetUnlessUserSet(config, "UCX_ZCOPY_THRESH", "ZCOPY_THRESH", "inf");  // ucp's: every transport's
  SetUnlessUserSet(config, "UCX_TCP_TX_SEG_SIZE", "TX_SEG_SIZE", "256kb");
  SetUnlessUserSet(config, "UCX_TCP_RX_SEG_SIZE", "RX_SEG_SIZE", "512kb");  // a segment + header
}

}  // namespace

std::string FormatSockAddr(const sockaddr* addr) {
  char host[INET6_ADDRSTRLEN] = {0};
  if (addr->sa_family == AF_INET) {
    auto* in = reinterpret_cast<const sockaddr_in*>(addr);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    return absl::StrCat(host, ":", ntohs(in->sin_port));
  }
  if (addr->sa_family == AF_INET6) {
    auto* in6 = reinterpret_cast<const sockaddr_in6*>(addr);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    return absl::StrCat("[", host, "]:", ntohs(in6->sin6_port));
  }
  return "?";
}

uint16_t SockAddrPort(const sockaddr* addr) {
  if (addr->sa_family == AF_INET)
    return ntohs(reinterpret_cast<const sockaddr_in*>(addr)->sin_port);
  if (addr->sa_family == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6*>(addr)->sin6_port);
  }
  return 0;
}

std::string UcsError(ucs_status_t status) { return ucs_status_string(status); }

absl::StatusOr<SockAddr> ResolveAddress(const std::string& address, bool passive) {
  absl::StatusOr<HostPort> host_port = ParseHostPort(address);
  if (!host_port.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("ucx: ", host_port.status().message()));
  }
  absl::StatusOr<SockAddr> resolved = Resolve(host_port->host, host_port->port, passive);
  if (resolved.ok()) resolved->host = host_port->host;
  return resolved;
}

void ConfigureContext(ucp_config_t* config, const TransportOptions& options) {
  ucs_status_t status = UCS_OK;
  // ucp's client-server setup (sockaddr CM) needs a transport on the network device the address
  // resolves to, and error mode PEER needs an AM lane with peer-failure support (posix and self
  // have none): in UCX 1.13 a shared-memory-only UCX_TLS (posix,cma,self) fails to connect with
  // "Destination is unreachable". Add tcp then: it carries connection setup and the AM lane, while
  // bulk data still moves by cma on a same-host link.
  if (const char* tls = std::getenv("UCX_TLS"); tls != nullptr && LacksNetworkTransport(tls)) {
    const std::string value = absl::StrCat(tls, ",tcp");
    status = ucp_config_modify(config, "TLS", value.c_str());
    static std::atomic<bool> said{false};
    if (status == UCS_OK && !said.exchange(true)) {
      spdlog::info(
          "ucx: UCX_TLS={} has no transport for connection setup and peer-failure "
          "detection; using {}",
          tls, value);
    }
  }
  // Error mode PEER makes ucp 1.13 require memory-invalidation support from rendezvous lanes, which
  // the cma memory domain only advertises when asked to (its invalidation is a no-op), so without
  // this a same-host link loses cma and falls back to tcp for bulk data. The cost: after a link
  // fails with a rendezvous send in flight, a still-running peer could read that payload's memory
  // after the transport released it (reads only; get scheme).
  // (ucp hands unknown keys to the UCT components without their prefix; an unused key draws a
  // warning, hence only when cma may be in use.)
  if (MayUseCma(std::getenv("UCX_TLS"))) {
    SetUnlessUserSet(config, "UCX_CMA_MEMORY_INVALIDATE", "MEMORY_INVALIDATE", "y");
  }
  if (MayUseTcp(std::getenv("UCX_TLS"))) KeepTcpOffZeroCopy(config);
  // Endpoint keepalive detects a dead peer below the application heartbeat, checking every
  // endpoint each round, so detection time does not grow with the link count.
  const int64_t keepalive_us =
      std::max<int64_t>(1, absl::ToInt64Microseconds(options.ucx_keepalive_interval));
  SetUnlessUserSet(config, "UCX_KEEPALIVE_INTERVAL", "KEEPALIVE_INTERVAL",
                   absl::StrCat(keepalive_us, "us"));
  SetUnlessUserSet(config, "UCX_KEEPALIVE_NUM_EPS", "KEEPALIVE_NUM_EPS", "inf");
}

// The transports the context uses, from ucp_context_print_info's "resource" lines
// ("#      resource 1  :  md 1  dev 1  flags -- tcp/lo"); ucp 1.13 has no query for them.
std::vector<std::string> ContextTransports(ucp_context_h context) {
  char* text = nullptr;
  size_t size = 0;
  FILE* stream = open_memstream(&text, &size);
  if (stream == nullptr) return {};
  ucp_context_print_info(context, stream);
  fclose(stream);
  std::vector<std::string> out;
  for (absl::string_view line : absl::StrSplit(absl::string_view(text, size), '\n')) {
    if (!absl::StrContains(line, "resource")) continue;
    size_t dashes = line.find("-- ");
    if (dashes == absl::string_view::npos) continue;
    absl::string_view resource = line.substr(dashes + 3);
    absl::string_view tl = resource.substr(0, resource.find('/'));
    while (!tl.empty() && tl.back() == ' ') tl.remove_suffix(1);
    if (!tl.empty() && std::find(out.begin(), out.end(), tl) == out.end()) out.emplace_back(tl);
  }
  free(text);
  return out;
}

// True for a UCX_TLS list that names no transport ucp's sockaddr connection manager can resolve
// an IP address to (an exclusion list "^..." or "all" keeps the network transports).
bool LacksNetworkTransport(absl::string_view tls) {
  static const char* const kNetwork[] = {
      "all", "tcp",  "ib",   "rc",       "rc_v",    "rc_x", "rc_verbs", "rc_mlx5",
      "ud",  "ud_v", "ud_x", "ud_verbs", "ud_mlx5", "dc",   "dc_x",     "dc_mlx5"};
  if (absl::StartsWith(tls, "^")) return false;
  for (absl::string_view tl : absl::StrSplit(tls, ',')) {
    tl = absl::StripAsciiWhitespace(tl);
    absl::ConsumePrefix(&tl, "\\");  // "\tcp": the same transport, without its aliases
    for (const char* network : kNetwork) {
      if (tl == network) return false;
    }
  }
  return true;
}

bool MayUseCma(const char* tls) { return Names(tls, {"cma", "sm", "shm", "scopy", "all"}); }

bool MayUseTcp(const char* tls) {
  return Names(tls, {"tcp", "all"}) || (tls != nullptr && LacksNetworkTransport(tls));
}

std::vector<std::string> EndpointLanes(ucp_ep_h ep) {
  std::vector<std::string> lanes;
  char* text = nullptr;
  size_t size = 0;
  FILE* stream = open_memstream(&text, &size);
  if (stream != nullptr) {
    // Lines like "#   lane[1]:  1:tcp/lo.0 md[0] -> ..." ("lane[0]: cm tcp" for the CM lane).
    ucp_ep_print_info(ep, stream);
    fclose(stream);
    for (absl::string_view line : absl::StrSplit(absl::string_view(text, size), '\n')) {
      size_t at = line.find("lane[");
      if (at == absl::string_view::npos) continue;
      at = line.find("]:", at);
      if (at == absl::string_view::npos) continue;
      absl::string_view rest = line.substr(at + 2);
      while (!rest.empty() && (rest.front() == ' ' || absl::ascii_isdigit(rest.front()))) {
        rest.remove_prefix(1);
      }
      if (!absl::ConsumePrefix(&rest, ":")) continue;  // the CM lane has no resource
      absl::string_view tl = rest.substr(0, rest.find('/'));
      if (!tl.empty() && std::find(lanes.begin(), lanes.end(), tl) == lanes.end()) {
        lanes.emplace_back(tl);
      }
    }
    free(text);
  }
  return lanes;
}

void FillCapabilities(const std::vector<std::string>& transports, Capabilities* capabilities) {
  static const char* const kRdma[] = {"rc", "rc_verbs", "rc_mlx5", "dc",  "dc_mlx5",
                                      "ud", "ud_verbs", "ud_mlx5", "srd", "gga"};
  for (const std::string& tl : transports) {
    for (const char* rdma : kRdma) capabilities->rdma |= tl == rdma;
    capabilities->gpu_memory |=
        absl::StartsWith(tl, "cuda") || absl::StartsWith(tl, "rocm") || absl::StartsWith(tl, "gdr");
  }
}

}  // namespace scd::transport::ucx_internal
