// Faults that need a second process and real sockets, on every cross-process backend: kill -9 of
// the sender or the receiver mid-session, a frozen sender (SIGSTOP: its TCP connection stays up,
// only the application heartbeat can tell), and a silent link (two network namespaces joined by a
// veth pair, the link set down mid-transfer; needs root, skipped with the reason otherwise).
// The other process is tests/transport_test_peer.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/change_notice.h"
#include "tests/transport_test_util.h"
#include "transport/session_acceptor.h"
#include "transport/transfer_session.h"

#if defined(__SANITIZE_ADDRESS__)
// <sanitizer/allocator_interface.h>, which Debian's gcc does not ship.
extern "C" int __sanitizer_install_malloc_and_free_hooks(
    void (*malloc_hook)(const volatile void*, size_t), void (*free_hook)(const volatile void*));
#endif

namespace scd::transport {
namespace {

#if defined(__SANITIZE_ADDRESS__)
// A forked child of this (multi-threaded) process must not allocate before exec: another thread
// may hold an allocator lock at fork(), which then stays held in the child for good (GCC 12's
// AddressSanitizer does not take its allocator's locks around fork). The child hung in malloc
// never became the peer and the test saw "no session ... within 10s". Under ASan any such
// allocation ends the child at once, loudly, instead of now and then never.
volatile std::sig_atomic_t in_forked_child = 0;
void RefuseAllocationInForkedChild(const volatile void*, size_t) {
  if (in_forked_child) {
    static const char message[] = "transport_process_test: allocation between fork and exec\n";
    [[maybe_unused]] const ssize_t n = write(2, message, sizeof(message) - 1);
    _exit(125);
  }
}
const bool kForkGuardInstalled = [] {
  pthread_atfork(nullptr, nullptr, [] { in_forked_child = 1; });
  // Both hooks or none: the sanitizer refuses a null one.
  __sanitizer_install_malloc_and_free_hooks(RefuseAllocationInForkedChild,
                                            [](const volatile void*) {});
  return true;
}();
#endif

// A child process whose stdout we read line by line.
class PeerProcess {
 public:
  explicit PeerProcess(std::vector<std::string> argv) {
    // Everything the child needs is prepared before fork: this process has threads (gRPC's, the
    // acceptor's, the connection gate's), and one of them may hold an allocator lock at fork();
    // the child may only dup2/close/exec (as base/child_process.cc does).
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    int fds[2];
    if (pipe(fds) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fds[1], 1);
      close(fds[0]);
      close(fds[1]);
      execvp(args[0], args.data());  // glibc searches PATH without allocating
      _exit(127);
    }
    close(fds[1]);
    fd_ = fds[0];
  }
  ~PeerProcess() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) close(fd_);
  }
  pid_t pid() const { return pid_; }

  // The next stdout line, or nullopt after `timeout` / at EOF.
  std::optional<std::string> ReadLine(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    for (;;) {
      const size_t nl = buffer_.find('\n');
      if (nl != std::string::npos) {
        std::string line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        return line;
      }
      const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
      if (left <= 0) return std::nullopt;
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left)) <= 0) continue;
      char chunk[4096];
      const ssize_t n = read(fd_, chunk, sizeof(chunk));
      if (n <= 0) return std::nullopt;
      buffer_.append(chunk, static_cast<size_t>(n));
    }
  }
  // Reads lines until one starts with `prefix`.
  std::optional<std::string> WaitFor(const std::string& prefix, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      auto line = ReadLine(deadline - absl::Now());
      if (!line) return std::nullopt;
      if (absl::StartsWith(*line, prefix)) return line;
    }
    return std::nullopt;
  }
  void Signal(int sig) { kill(pid_, sig); }
  // For a failure message: whether the peer still runs (and as what) or how it ended, and what it
  // printed that the test did not read (e.g. "RESULT connect_failed ...").
  std::string Describe() {
    std::string out = absl::StrCat("peer pid ", pid_);
    int status = 0;
    if (!reaped_ && waitpid(pid_, &status, WNOHANG) == pid_) {
      reaped_ = true;
      absl::StrAppend(&out, WIFEXITED(status) ? " exited " : " killed by signal ",
                      WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    } else if (!reaped_) {
      char exe[512];
      const ssize_t n =
          readlink(absl::StrCat("/proc/", pid_, "/exe").c_str(), exe, sizeof(exe) - 1);
      absl::StrAppend(&out, " running ", n > 0 ? std::string(exe, static_cast<size_t>(n)) : "?");
    }
    while (auto line = ReadLine(absl::Milliseconds(100))) absl::StrAppend(&out, "\n  ", *line);
    return out;
  }
  void Reap() {
    waitpid(pid_, nullptr, 0);
    reaped_ = true;
  }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  bool reaped_ = false;
  std::string buffer_;
};

std::string PeerBinary() { return absl::StrCat(SCD_BUILD_DIR, "/bin/transport_test_peer"); }

std::vector<std::string> CrossProcessBackends() {
  std::vector<std::string> out;
  for (const std::string& b : AvailableBackends()) {
    if (b != "inproc") out.push_back(b);
  }
  return out;
}

class TransportProcessTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    TransportOptions options;
    options.backend = GetParam();
    auto transport = CreateTransport(options);
    if (!transport.ok()) GTEST_SKIP() << transport.status();
    transport_ = *std::move(transport);
  }
  // A receiving acceptor in this process.
  std::unique_ptr<SessionAcceptor> Listen(const std::string& host = "127.0.0.1") {
    auto listener = transport_->Listen(absl::StrCat(host, ":0"));
    EXPECT_TRUE(listener.ok()) << listener.status();
    return std::make_unique<SessionAcceptor>(*std::move(listener), ConnectionOptions{});
  }
  std::vector<std::string> PeerArgs(const std::string& role, const std::string& address,
                                    int interval_ms, size_t chunk_bytes = 65536) {
    return {PeerBinary(),
            "--role=" + role,
            "--backend=" + GetParam(),
            "--address=" + address,
            "--chunks=100000",
            absl::StrCat("--chunk-bytes=", chunk_bytes),
            absl::StrCat("--interval-ms=", interval_ms)};
  }
  // The backends' own keepalives (gRPC pings, UCX endpoint keepalive) are tuned to notice a dead
  // peer within about the same second and could win the race; slowed down, the application
  // heartbeat alone must tell (their own tests cover them).
  void UseSlowBackendKeepalives() {
    TransportOptions options;
    options.backend = GetParam();
    options.grpc_keepalive_interval = absl::Seconds(5);
    options.grpc_keepalive_timeout = absl::Seconds(10);
    options.ucx_keepalive_interval = absl::Seconds(5);
    auto transport = CreateTransport(options);
    ASSERT_TRUE(transport.ok()) << transport.status();
    transport_ = *std::move(transport);
  }
  std::unique_ptr<Transport> transport_;
};

// Receives from `session` until it ends; returns when it ended.
absl::Time DrainUntilEnd(ReceiveSession& session, absl::Duration limit) {
  const absl::Time deadline = absl::Now() + limit;
  while (absl::Now() < deadline) {
    auto chunk = session.Next(deadline - absl::Now());
    if (!chunk.ok() && session.state() != SessionState::kOpen) break;
    if (chunk.ok() && !chunk->has_value()) break;
  }
  return absl::Now();
}

TEST_P(TransportProcessTest, KillingTheSenderEndsTheReceiversSessionPeerLostWithinASecond) {
  auto acceptor = Listen();
  PeerProcess peer(PeerArgs("send", acceptor->address(), 10));
  auto session = acceptor->Accept(absl::Seconds(10));
  ASSERT_TRUE(session.ok()) << session.status() << "; " << peer.Describe();
  for (int i = 0; i < 5; ++i) ASSERT_TRUE((*session)->Next(absl::Seconds(5)).ok());
  const absl::Time killed = absl::Now();
  peer.Signal(SIGKILL);
  peer.Reap();
  const absl::Time ended = DrainUntilEnd(**session, absl::Seconds(5));
  EXPECT_EQ((*session)->state(), SessionState::kPeerLost) << (*session)->status();
  EXPECT_LE(ended - killed, absl::Seconds(1));
  std::printf("%s: receiver saw the sender's death after %s\n", GetParam().c_str(),
              absl::FormatDuration(ended - killed).c_str());
}

// Found by the soak (bench/soak.h): the acceptor dropped a dead peer's connection only when
// another connected, so a producer killed and restarted left a connection -- and its thread --
// behind on every consumer it had sent to. Now it goes within the accept loop's next turn.
TEST_P(TransportProcessTest, ADeadSendersConnectionIsDroppedWithoutAnotherConnecting) {
  auto acceptor = Listen();
  PeerProcess peer(PeerArgs("send", acceptor->address(), 10));
  auto session = acceptor->Accept(absl::Seconds(10));
  ASSERT_TRUE(session.ok()) << session.status() << "; " << peer.Describe();
  ASSERT_TRUE((*session)->Next(absl::Seconds(5)).ok());
  EXPECT_EQ(acceptor->connections(), 1u);
  peer.Signal(SIGKILL);
  peer.Reap();
  DrainUntilEnd(**session, absl::Seconds(5));
  ASSERT_EQ((*session)->state(), SessionState::kPeerLost) << (*session)->status();
  const absl::Time ended = absl::Now();
  // Woken when the acceptor drops a connection (base/change_notice.h).
  EXPECT_TRUE(AwaitChange([&] { return acceptor->connections() == 0; }, ended + absl::Seconds(5)));
  EXPECT_LE(absl::Now() - ended, absl::Seconds(1));
}

TEST_P(TransportProcessTest, KillingTheReceiverEndsTheSendersSessionAndReleasesItsBuffers) {
  PeerProcess peer(PeerArgs("recv", "127.0.0.1:0", 20));
  auto listening = peer.WaitFor("LISTENING ", absl::Seconds(10));
  ASSERT_TRUE(listening.has_value());
  const std::string address = listening->substr(10);
  testing::WatchedBytes bytes(std::string(256 << 10, 'b'));
  {
    auto link = transport_->Connect(address, absl::Seconds(5));
    ASSERT_TRUE(link.ok()) << link.status();
    ConnectionOptions options;
    options.max_inflight_bytes = 1 << 20;
    auto connection = TransferConnection::Create(*std::move(link), options);
    auto session = connection->StartSession(v1::TransferHeader(), absl::Seconds(60));
    ASSERT_TRUE(session.ok());
    absl::Time killed = absl::InfiniteFuture();
    absl::Status last;
    for (int i = 0; i < 100000; ++i) {
      last = (*session)->SendChunk(v1::CodeChunk(), bytes.View());
      if (!last.ok()) break;
      if (i == 8) {
        ASSERT_TRUE(peer.WaitFor("CHUNK 2", absl::Seconds(5)).has_value());
        killed = absl::Now();
        peer.Signal(SIGKILL);
        peer.Reap();
      }
    }
    ASSERT_TRUE((*session)->WaitForEnd(absl::Seconds(5)));
    const absl::Duration took = (*session)->stats().end - killed;
    EXPECT_EQ((*session)->state(), SessionState::kPeerLost) << last;
    EXPECT_LE(took, absl::Seconds(1));
    std::printf("%s: sender saw the receiver's death after %s\n", GetParam().c_str(),
                absl::FormatDuration(took).c_str());
    // Every reference to the sender's bytes is gone once the session ended and the link is down.
    EXPECT_TRUE(bytes.AwaitReleased(absl::Seconds(1))) << "buffers still held after the peer died";
  }
  EXPECT_EQ(LiveTransportBuffers(), 0);
}

TEST_P(TransportProcessTest, AFrozenSenderEndsTheReceiversSessionWithinTheLivenessLimit) {
  UseSlowBackendKeepalives();
  auto acceptor = Listen();
  PeerProcess peer(PeerArgs("send", acceptor->address(), 10));
  auto session = acceptor->Accept(absl::Seconds(10));
  ASSERT_TRUE(session.ok()) << session.status() << "; " << peer.Describe();
  for (int i = 0; i < 5; ++i) ASSERT_TRUE((*session)->Next(absl::Seconds(5)).ok());
  const absl::Time stopped = absl::Now();
  peer.Signal(SIGSTOP);  // the process freezes; its sockets stay open
  const absl::Time ended = DrainUntilEnd(**session, absl::Seconds(5));
  peer.Signal(SIGKILL);
  peer.Signal(SIGCONT);
  peer.Reap();
  EXPECT_EQ((*session)->state(), SessionState::kPeerLost) << (*session)->status();
  // Liveness limit 1 s after the last frame the peer sent before it froze.
  EXPECT_LE(ended - stopped, absl::Milliseconds(1100));
  EXPECT_NE((*session)->status().message().find("liveness"), std::string::npos)
      << (*session)->status();
  std::printf("%s: frozen sender detected after %s\n", GetParam().c_str(),
              absl::FormatDuration(ended - stopped).c_str());
}

// CPU time this process used in `window` of wall time, as a share of one core.
double CoreShare(absl::Duration window) {
  auto cpu = [] {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    return absl::DurationFromTimeval(usage.ru_utime) + absl::DurationFromTimeval(usage.ru_stime);
  };
  const absl::Duration before = cpu();
  // paces: the window the CPU share is measured over
  absl::SleepFor(window);
  return absl::FDivDuration(cpu() - before, window);
}

TEST_P(TransportProcessTest, AfterAStalledPeerTheTransportsThreadsIdle) {
  // Issue 14: once a stalled peer had been declared dead, the connection's timer thread found its
  // heartbeat due forever (never advanced on a down link) and spun a core.
  UseSlowBackendKeepalives();
  auto acceptor = Listen();
  PeerProcess peer(PeerArgs("send", acceptor->address(), 10));
  auto session = acceptor->Accept(absl::Seconds(10));
  ASSERT_TRUE(session.ok()) << session.status() << "; " << peer.Describe();
  ASSERT_TRUE((*session)->Next(absl::Seconds(5)).ok());
  peer.Signal(SIGSTOP);  // stalls past the liveness limit
  DrainUntilEnd(**session, absl::Seconds(5));
  ASSERT_EQ((*session)->state(), SessionState::kPeerLost) << (*session)->status();
  // The dead connection is still held by the acceptor: its threads must sleep.
  // waits: the session's end work to finish before the idle CPU is measured (idleness is what is
  //  measured, so nothing signals it)
  absl::SleepFor(absl::Milliseconds(200));
  const double share = CoreShare(absl::Seconds(1));
  peer.Signal(SIGKILL);
  peer.Signal(SIGCONT);
  peer.Reap();
  EXPECT_LT(share, 0.05) << "the idle transport used " << 100 * share << " % of a core";
  std::printf("%s: %.2f %% of a core while idle after the stall\n", GetParam().c_str(),
              100 * share);
}

// ---- silent link: veth pair between this namespace and a new one --------------------------------

int Run(const std::string& command) { return std::system((command + " >/dev/null 2>&1").c_str()); }

class VethPair {
 public:
  VethPair() {
    const int id = static_cast<int>(getpid() % 200) + 20;
    ns_ = absl::StrCat("scdtest", getpid());
    outer_ = absl::StrCat("scdv", getpid() % 100000, "a");
    inner_ = absl::StrCat("scdv", getpid() % 100000, "b");
    outer_ip_ = absl::StrCat("10.213.", id, ".1");
    inner_ip_ = absl::StrCat("10.213.", id, ".2");
    if (geteuid() != 0) {
      why_not_ = "not root: creating network namespaces and veth pairs needs CAP_NET_ADMIN";
      return;
    }
    const std::vector<std::string> steps = {
        "ip netns add " + ns_,
        absl::StrCat("ip link add ", outer_, " type veth peer name ", inner_),
        absl::StrCat("ip link set ", inner_, " netns ", ns_),
        absl::StrCat("ip addr add ", outer_ip_, "/24 dev ", outer_),
        absl::StrCat("ip link set ", outer_, " up"),
        absl::StrCat("ip netns exec ", ns_, " ip addr add ", inner_ip_, "/24 dev ", inner_),
        absl::StrCat("ip netns exec ", ns_, " ip link set ", inner_, " up"),
        absl::StrCat("ip netns exec ", ns_, " ip link set lo up"),
    };
    for (const std::string& step : steps) {
      if (Run(step) != 0) {
        why_not_ = "could not set up the veth pair ('" + step +
                   "' failed: no `ip` tool or no CAP_NET_ADMIN in this container)";
        return;
      }
    }
    ready_ = true;
  }
  ~VethPair() {
    Run("ip link del " + outer_);
    Run("ip netns del " + ns_);
  }
  bool ready() const { return ready_; }
  const std::string& why_not() const { return why_not_; }
  const std::string& ns() const { return ns_; }
  const std::string& inner_ip() const { return inner_ip_; }
  const std::string& outer_device() const { return outer_; }
  const std::string& inner_device() const { return inner_; }
  bool SetDown() { return Run(absl::StrCat("ip link set ", outer_, " down")) == 0; }

 private:
  std::string ns_, outer_, inner_, outer_ip_, inner_ip_, why_not_;
  bool ready_ = false;
};

TEST_P(TransportProcessTest, ASilentLinkEndsBothSidesWithinTheLivenessLimit) {
  VethPair veth;
  if (!veth.ready()) GTEST_SKIP() << "silent-link test skipped: " << veth.why_not();
  std::vector<std::string> args = {"ip", "netns", "exec", veth.ns()};
  if (GetParam() == "ucx") {
    // UCX wires endpoints over every network device it is allowed; across namespaces only the
    // veth pair connects the two sides, so each side names its end (as deployments name NICs).
    args.push_back("env");
    args.push_back("UCX_NET_DEVICES=" + veth.inner_device());
    setenv("UCX_NET_DEVICES", veth.outer_device().c_str(), 1);
    TransportOptions options;
    options.backend = "ucx";
    auto transport = CreateTransport(options);
    unsetenv("UCX_NET_DEVICES");
    ASSERT_TRUE(transport.ok()) << transport.status();
    transport_ = *std::move(transport);
  }
  for (const std::string& a : PeerArgs("recv", veth.inner_ip() + ":0", 0)) args.push_back(a);
  PeerProcess peer(args);
  auto listening = peer.WaitFor("LISTENING ", absl::Seconds(10));
  ASSERT_TRUE(listening.has_value()) << "peer did not start in namespace " << veth.ns();
  auto link = transport_->Connect(listening->substr(10), absl::Seconds(5));
  ASSERT_TRUE(link.ok()) << link.status();
  auto connection = TransferConnection::Create(*std::move(link), {});
  auto session = connection->StartSession(v1::TransferHeader(), absl::Seconds(60));
  ASSERT_TRUE(session.ok());
  const std::string block(64 << 10, 's');
  absl::Time cut = absl::InfiniteFuture();
  for (int i = 0; i < 100000 && (*session)->state() == SessionState::kOpen; ++i) {
    if (!(*session)->SendChunk(v1::CodeChunk(), Payload::Copy(block.data(), block.size())).ok()) {
      break;
    }
    if (i == 20) {
      ASSERT_TRUE(peer.WaitFor("CHUNK 5", absl::Seconds(5)).has_value());
      cut = absl::Now();
      ASSERT_TRUE(veth.SetDown());
    }
    // paces: a sender at 5 ms a chunk while the link goes down (the scenario)
    if (i > 20) absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_TRUE((*session)->WaitForEnd(absl::Seconds(5)));
  const absl::Duration sender_took = (*session)->stats().end - cut;
  EXPECT_EQ((*session)->state(), SessionState::kPeerLost) << (*session)->status();
  EXPECT_LE(sender_took, absl::Milliseconds(1100));
  // The receiver, on the other side of the dead link, reports how it ended.
  auto result = peer.WaitFor("RESULT ", absl::Seconds(5));
  ASSERT_TRUE(result.has_value()) << "the receiver did not end within 5 s of the cut";
  const absl::Duration receiver_took = absl::Now() - cut;
  std::vector<std::string> words = absl::StrSplit(*result, ' ');
  EXPECT_EQ(words[1], "peer_lost") << *result;
  EXPECT_LE(receiver_took, absl::Milliseconds(1500)) << *result;  // includes reading its output
  std::printf("%s: silent link: sender ended after %s, receiver reported after %s\n",
              GetParam().c_str(), absl::FormatDuration(sender_took).c_str(),
              absl::FormatDuration(receiver_took).c_str());
  // Close our sockets before the veth pair goes: a device that TCP sockets still reference makes
  // the kernel wait up to ~10 s to unregister it.
  session->reset();
  connection.reset();
  transport_.reset();
}

INSTANTIATE_TEST_SUITE_P(Backends, TransportProcessTest,
                         ::testing::ValuesIn(CrossProcessBackends()),
                         [](const auto& info) { return info.param; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(TransportProcessTest);

}  // namespace
}  // namespace scd::transport
