#include "base/host_port.h"

#include <arpa/inet.h>

#include <cctype>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

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

namespace {

bool IsIpAddress(const std::string& host) {
  unsigned char buffer[16];
  return inet_pton(AF_INET, host.c_str(), buffer) == 1 ||
         inet_pton(AF_INET6, host.c_str(), buffer) == 1;
}

// RFC 1123: dot-separated labels of letters, digits and '-', each 1..63 long and neither
// starting nor ending with '-'; 253 characters at most.
bool IsHostName(absl::string_view host) {
  if (host.empty() || host.size() > 253) return false;
  for (absl::string_view label : absl::StrSplit(host, '.')) {
    if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-') {
      return false;
    }
    for (char c : label) {
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-') return false;
    }
  }
  return true;
}

}  // namespace

absl::Status CheckHost(absl::string_view host, absl::string_view what) {
  absl::string_view bare = host;
  if (bare.size() >= 2 && bare.front() == '[' && bare.back() == ']') {
    bare = bare.substr(1, bare.size() - 2);
  }
  if (IsIpAddress(std::string(bare)) || IsHostName(bare)) return absl::OkStatus();
  std::string hint;
  if (absl::StrContains(host, "$(")) {
    hint = " (an unexpanded $(VAR): the variable is not defined in the container's env)";
  }
  return absl::InvalidArgumentError(
      absl::StrCat(what, " \"", host, "\" is neither an IP address nor a host name", hint));
}

}  // namespace scd
