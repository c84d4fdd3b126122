// base/connection_gate.h with real sockets on loopback: a connection reaches the server only once
// its preface arrived (and then with its bytes unread); a wrong preface, a peer that closes, and a
// silent one past the handshake timeout are closed; one past max_pending evicts the oldest waiting,
// so a real client still gets in; a used port is an error that says so; Stop closes the rest, and
// the stopped port refuses new connections.
#include "base/connection_gate.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"

namespace scd {
namespace {

constexpr char kPreface[] = "HELLO-PREFACE-0123456789";

int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)), 0);
  return fd;
}

void Send(int fd, const std::string& bytes) {
  ASSERT_EQ(write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
}

// True when the peer closed `fd` within `timeout`: end of stream, or a reset (a socket closed with
// our bytes unread resets the connection).
bool ClosedByPeer(int fd, absl::Duration timeout) {
  timeval tv{static_cast<time_t>(absl::ToInt64Seconds(timeout)), 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char byte;
  const ssize_t n = read(fd, &byte, 1);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

class ConnectionGateTest : public ::testing::Test {
 protected:
  void Start(ConnectionGateOptions options) {
    options.preface = kPreface;
    gate_ = *ConnectionGate::Listen("127.0.0.1:0", options);
    gate_->Start([this](int fd) {
      absl::MutexLock lock(&mu_);
      handed_.push_back(fd);
    });
  }
  // How many connections were handed over once `expected` were or `timeout` passed.
  size_t AwaitHanded(size_t expected, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return handed_.size() >= expected; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
    return handed_.size();
  }
  // The handed-over connections' first bytes (what the server would read; read once), once
  // `expected` were handed over or `timeout` passed.
  std::vector<std::string> HandedBytes(size_t expected, absl::Duration timeout) {
    AwaitHanded(expected, timeout);
    absl::MutexLock lock(&mu_);
    std::vector<std::string> bytes;
    for (int fd : handed_) {
      char buffer[64] = {};
      timeval tv{1, 0};
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      const ssize_t n = recv(fd, buffer, sizeof(kPreface) - 1, MSG_WAITALL);
      bytes.emplace_back(buffer, n > 0 ? static_cast<size_t>(n) : 0);
    }
    return bytes;
  }
  void TearDown() override {
    if (gate_) gate_->Stop();
    absl::MutexLock lock(&mu_);
    for (int fd : handed_) close(fd);
  }

  std::unique_ptr<ConnectionGate> gate_;
  absl::Mutex mu_;
  std::vector<int> handed_ ABSL_GUARDED_BY(mu_);
};

TEST_F(ConnectionGateTest, HandsOverOnlyConnectionsWhosePrefaceArrivedUnread) {
  Start({});
  const int client = Connect(gate_->port());
  Send(client, std::string(kPreface).substr(0, 10));  // half of it: not yet
  // A client that connects and sends its whole preface after it is handed over; the gate's loop
  // accepted and read the first before (its accept queue and its readiness list keep the order),
  // so the first, still waiting, is the one with half a preface.
  const int later = Connect(gate_->port());
  Send(later, kPreface);
  ASSERT_EQ(AwaitHanded(1, absl::Seconds(5)), 1u);
  EXPECT_EQ(gate_->counters().handed, 1u);
  Send(client, std::string(kPreface).substr(10));
  std::vector<std::string> bytes = HandedBytes(2, absl::Seconds(5));
  ASSERT_EQ(bytes.size(), 2u);
  EXPECT_EQ(bytes[0], kPreface);  // peeked, not consumed
  EXPECT_EQ(bytes[1], kPreface);
  close(client);
  close(later);
}

TEST_F(ConnectionGateTest, WrongPrefaceSilenceAndFloodsAreClosedNotHeld) {
  ConnectionGateOptions options;
  options.handshake_timeout = absl::Milliseconds(300);
  options.max_pending = 8;
  Start(options);
  const int wrong = Connect(gate_->port());
  Send(wrong, "GET / HTTP/1.1\r\n");
  EXPECT_TRUE(ClosedByPeer(wrong, absl::Seconds(2)));
  const int silent = Connect(gate_->port());
  const absl::Time start = absl::Now();
  EXPECT_TRUE(ClosedByPeer(silent, absl::Seconds(3)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(250));
  EXPECT_EQ(gate_->counters().timed_out, 1u);
  EXPECT_GE(gate_->counters().refused, 1u);
  // 40 half-open connections with room for 8: the oldest are evicted, and a real client that
  // comes after them is handed over at once.
  std::vector<int> flood;
  for (int i = 0; i < 40; ++i) {
    flood.push_back(Connect(gate_->port()));
    Send(flood.back(), "HEL");
  }
  const int real = Connect(gate_->port());
  Send(real, kPreface);
  EXPECT_EQ(HandedBytes(1, absl::Seconds(2)).size(), 1u);
  EXPECT_GE(gate_->counters().evicted, 30u);
  for (int fd : flood) close(fd);
  close(wrong), close(silent), close(real);
}

TEST_F(ConnectionGateTest, AUsedPortIsAnErrorThatSaysSo) {
  Start({});
  auto second = ConnectionGate::Listen("127.0.0.1:" + std::to_string(gate_->port()), {});
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find("already in use"), std::string::npos)
      << second.status();
  EXPECT_EQ(ConnectionGate::Listen("no-port", {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(ConnectionGateTest, StopClosesWhatWaits) {
  Start({});
  const int waiting = Connect(gate_->port());
  // Once a client connected after it is handed over, the gate holds `waiting` (accepted first).
  const int later = Connect(gate_->port());
  Send(later, kPreface);
  ASSERT_EQ(AwaitHanded(1, absl::Seconds(5)), 1u);
  close(later);
  gate_->Stop();
  EXPECT_TRUE(ClosedByPeer(waiting, absl::Seconds(2)));
  close(waiting);
}

// A stopped gate's port refuses new connections at once (its listening socket is closed by Stop,
// not later with the gate): a client reconnecting to a server that was shut down fails at once
// instead of connecting into a backlog nobody accepts and waiting there for its keepalive.
TEST_F(ConnectionGateTest, AStoppedGatesPortRefusesNewConnections) {
  Start({});
  const int port = gate_->port();
  gate_->Stop();
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)), -1);
  EXPECT_EQ(errno, ECONNREFUSED);
  close(fd);
  gate_->Stop();  // again: nothing left to close
}

TEST(OpenFileLimitTest, RaisedToTheHardLimit) {
  const uint64_t soft = RaiseOpenFileLimit();
  rlimit limit{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &limit), 0);
  EXPECT_EQ(limit.rlim_cur, limit.rlim_max);
  EXPECT_EQ(soft, limit.rlim_cur);
}

}  // namespace
}  // namespace scd
