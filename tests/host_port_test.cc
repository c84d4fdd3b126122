#include "base/host_port.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace scd {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(HostPortTest, ParsesNamesAddressesAndBracketedIpv6) {
  struct Case {
    const char* address;
    const char* host;
    uint16_t port;
    const char* written;
  };
  for (const Case& c :
       {Case{"127.0.0.1:80", "127.0.0.1", 80, "127.0.0.1:80"},
        Case{"node-1:0", "node-1", 0, "node-1:0"}, Case{"[::1]:9000", "::1", 9000, "[::1]:9000"},
        Case{":65535", "", 65535, ":65535"}, Case{"[::]:1", "::", 1, "[::]:1"}}) {
    absl::StatusOr<HostPort> hp = ParseHostPort(c.address);
    ASSERT_TRUE(hp.ok()) << c.address << ": " << hp.status();
    EXPECT_EQ(hp->host, c.host);
    EXPECT_EQ(hp->port, c.port);
    EXPECT_EQ(hp->ToString(), c.written);
  }
  EXPECT_TRUE(ParseHostPort("0.0.0.0:1")->wildcard());
  EXPECT_TRUE(ParseHostPort("[::]:1")->wildcard());
  EXPECT_TRUE(ParseHostPort(":1")->wildcard());
  EXPECT_FALSE(ParseHostPort("10.0.0.1:1")->wildcard());
}

TEST(HostPortTest, RefusesWhatIsNotHostPortNamingIt) {
  for (const char* bad : {"localhost", "host:", "host:http", "host:65536", "host:-1", "::1:80",
                          "[::1:80", "::1]:80", "[]x:80"}) {
    absl::StatusOr<HostPort> hp = ParseHostPort(bad);
    EXPECT_FALSE(hp.ok()) << bad;
    EXPECT_EQ(hp.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(hp.status().message().find(bad), std::string::npos) << hp.status();
  }
}

}  // namespace
TEST(HostPortTest, ChecksHostsAsAddressesOrNames) {
  for (const std::string& host :
       std::vector<std::string>{"10.89.1.12", "::1", "[fd00::7]", "scd-etcd", "node-1.scd.svc",
                                "A1", std::string(63, 'a')}) {
    EXPECT_TRUE(CheckHost(host, "--advertise").ok()) << host;
  }
  for (const std::string& host :
       std::vector<std::string>{"", "-node", "node-", "a..b", "under_score", "10.0.0.1:80", "[::1",
                                "has space", std::string(64, 'a')}) {
    absl::Status status = CheckHost(host, "--advertise");
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << host;
    EXPECT_THAT(std::string(status.message()), HasSubstr("--advertise")) << host;
    EXPECT_THAT(std::string(status.message()), Not(HasSubstr("$(VAR)"))) << host;
  }
  // What Kubernetes passes when the variable is missing from the container's env.
  absl::Status status = CheckHost("$(POD_IP)", "--advertise");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("\"$(POD_IP)\" is neither an IP address nor a host name (an unexpanded "
                        "$(VAR): the variable is not defined in the container's env)"));
}

}  // namespace scd
