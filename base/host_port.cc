#include "base/host_port.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace scd {

std::string HostPort::ToString() const {
  if (host.find(':') != std::string::npos) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

bool HostPort::wildcard() const { return host.empty() || host == "0.0.0.0" || host == "::"; }

absl::StatusOr<HostPort> ParseHostPort(absl::string_view address) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("address '", address, "' is not host:port (", why, ")"));
  };
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) return bad("no port");
  absl::string_view host = address.substr(0, colon);
  if (!host.empty() && (host.front() == '[' || host.back() == ']')) {
    if (host.size() < 2 || host.front() != '[' || host.back() != ']') {
      return bad("unbalanced brackets");
    }
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != absl::string_view::npos) {
    return bad("an IPv6 host needs brackets: [::1]:port");
  }
  uint32_t port = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &port) || port > 65535) {
    return bad("the port must be 0..65535");
  }
  return HostPort{std::string(host), static_cast<uint16_t>(port)};
}

}  // namespace scd
