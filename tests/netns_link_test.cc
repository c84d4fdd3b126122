// NetnsNode (bench/netns_link.h): a node's own network namespace whose link to the caller's can
// be cut and restored -- checked with real connections from inside the namespace to a listener
// in this process, and nothing left behind once it is gone. Needs root (skipped otherwise, as
// bandwidth_sweep_test's netns link).
#include "bench/netns_link.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/child_process.h"

namespace scd::bench {
namespace {

// A listening TCP socket on `ip`, any port; the port (-1 on failure).
int Listen(const std::string& ip, int* fd) {
  *fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  inet_pton(AF_INET, ip.c_str(), &address.sin_addr);
  socklen_t length = sizeof(address);
  if (bind(*fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      listen(*fd, 16) != 0 ||
      getsockname(*fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    return -1;
  }
  return ntohs(address.sin_port);
}

// Whether a connection from inside `node` to ip:port is made within 2 s.
bool ConnectsFromInside(const NetnsNode& node, const std::string& ip, int port) {
  absl::StatusOr<ChildProcess::Outcome> run = ChildProcess::Run(
      node.Inside({"timeout", "2", "bash", "-c", absl::StrCat("exec 3<>/dev/tcp/", ip, "/", port)}),
      absl::Seconds(10));
  return run.ok() && run->status == 0;
}

TEST(NetnsNodeTest, ItsLinkGoesDownAndUpAndNothingIsLeftBehind) {
  if (geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
  {
    absl::StatusOr<NetnsNode> node = NetnsNode::Create();
    ASSERT_TRUE(node.ok()) << node.status();
    EXPECT_NE(node->host_ip(), node->node_ip());
    int fd = -1;
    const int port = Listen(node->host_ip(), &fd);
    ASSERT_GT(port, 0);
    EXPECT_TRUE(ConnectsFromInside(*node, node->host_ip(), port));
    ASSERT_TRUE(node->SetLinkUp(false).ok());
    EXPECT_FALSE(ConnectsFromInside(*node, node->host_ip(), port));  // the cable pulled
    ASSERT_TRUE(node->SetLinkUp(true).ok());
    // Back: the link and its route return at once; allowed a few tries, not a bound.
    bool back = false;
    for (int i = 0; i < 5 && !back; ++i) back = ConnectsFromInside(*node, node->host_ip(), port);
    EXPECT_TRUE(back);
    close(fd);
    const std::vector<std::string> there = NetnsLink::Leftovers();
    EXPECT_NE(std::find(there.begin(), there.end(), absl::StrCat("scdb", getpid(), "n")),
              there.end());
  }
  const std::vector<std::string> left = NetnsLink::Leftovers();
  EXPECT_EQ(std::find(left.begin(), left.end(), absl::StrCat("scdb", getpid(), "n")), left.end());
  const absl::StatusOr<ChildProcess::Outcome> links = ChildProcess::Run({"ip", "link", "show"});
  ASSERT_TRUE(links.ok());
  EXPECT_EQ(links->output.find(absl::StrCat("scdb", getpid(), "m")), std::string::npos);
}

}  // namespace
}  // namespace scd::bench
