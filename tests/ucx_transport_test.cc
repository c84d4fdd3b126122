// What only the UCX backend (transport/ucx/) has, once over UCX_TLS=tcp and once over shared memory
// (posix,cma,self): capabilities and lane descriptions, destroying the transport under its links,
// peer death detected by the endpoint's error handling, no transport buffer outliving the links,
// and a rough bandwidth print to compare with ucx_perftest. The Link contract every backend keeps
// (order, lanes, Start, Close, DropSession): link_contract_test.
#include "transport/ucx/ucx_transport.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tests/transport_test_util.h"

extern char** environ;

namespace scd::transport {
namespace {

using ::scd::testing::FrameRecorder;
using ::scd::testing::MakeFrame;
using ::scd::testing::PatternBytes;

constexpr char kPeerEnv[] = "SCD_UCX_TEST_PEER_ADDRESS";

// Started as the peer of PeerProcessKilledIsDetected (this binary re-executed with kPeerEnv set):
// connect, say hello, and wait to be killed. Runs before main, so no test runs in that process.
[[maybe_unused]] const bool kRanAsPeer = [] {
  const char* address = std::getenv(kPeerEnv);
  if (address == nullptr) return false;
  auto transport = NewUcxTransport(TransportOptions());
  if (!transport.ok()) _exit(2);
  auto link = (*transport)->Connect(address, absl::Seconds(10));
  if (!link.ok()) _exit(3);
  if (!(*link)->Send(MakeFrame(FrameType::kHeartbeat, 0, "peer up")).ok()) _exit(4);
  for (;;) pause();
}();

// Counts data bytes and drops every payload at once (the bandwidth test's receiver).
class CountingHandler : public LinkHandler {
 public:
  void OnFrame(Frame frame) override {
    absl::MutexLock lock(&mu_);
    bytes_ += frame.payload.size();
    ++frames_;
  }
  void OnLinkDown(absl::Status) override {}
  bool WaitForFrames(int64_t count, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return frames_ >= count; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }

 private:
  absl::Mutex mu_;
  int64_t frames_ ABSL_GUARDED_BY(mu_) = 0;
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

struct Tls {
  const char* name;
  const char* ucx_tls;
};

class UcxTransportTest : public ::testing::TestWithParam<Tls> {
 protected:
  void SetUp() override {
    // Read by ucp_config_read when each transport is created.
    setenv("UCX_TLS", GetParam().ucx_tls, 1);
    server_ = MakeTransport();
    client_ = MakeTransport();
    ASSERT_NE(server_, nullptr);
    ASSERT_NE(client_, nullptr);
    auto listener = server_->Listen("127.0.0.1:0");
    ASSERT_TRUE(listener.ok()) << listener.status();
    listener_ = *std::move(listener);
  }

  void TearDown() override {
    listener_.reset();
    client_.reset();
    server_.reset();
    EXPECT_EQ(LiveTransportBuffers(), 0);
  }

  static std::unique_ptr<Transport> MakeTransport() {
    TransportOptions options;
    options.backend = "ucx";
    auto transport = NewUcxTransport(options);
    EXPECT_TRUE(transport.ok()) << transport.status();
    return transport.ok() ? *std::move(transport) : nullptr;
  }

  // {client side, server side} of a new link.
  std::pair<std::unique_ptr<Link>, std::unique_ptr<Link>> ConnectPair() {
    auto client = client_->Connect(listener_->address(), absl::Seconds(5));
    EXPECT_TRUE(client.ok()) << client.status();
    auto server = listener_->Accept(absl::Seconds(5));
    EXPECT_TRUE(server.ok()) << server.status();
    if (!client.ok() || !server.ok()) return {};
    return {*std::move(client), *std::move(server)};
  }

  std::unique_ptr<Transport> server_;
  std::unique_ptr<Transport> client_;
  std::unique_ptr<Listener> listener_;
};

TEST_P(UcxTransportTest, CapabilitiesAndDescribe) {
  const Capabilities& caps = client_->capabilities();
  EXPECT_EQ(caps.backend, "ucx");
  EXPECT_TRUE(caps.cross_process);
  EXPECT_TRUE(caps.zero_copy_send);
  EXPECT_FALSE(caps.rdma);
  EXPECT_FALSE(caps.gpu_memory);
  EXPECT_EQ(caps.max_message_bytes, 0u);
  if (std::string(GetParam().name) == "tcp") {
    EXPECT_EQ(caps.devices, std::vector<std::string>{"tcp"});
  } else {
    EXPECT_NE(std::find(caps.devices.begin(), caps.devices.end(), "posix"), caps.devices.end());
    EXPECT_NE(std::find(caps.devices.begin(), caps.devices.end(), "cma"), caps.devices.end());
  }
  EXPECT_TRUE(absl::StartsWith(listener_->address(), "127.0.0.1:"));
  EXPECT_NE(listener_->address(), "127.0.0.1:0");
  auto [client, server] = ConnectPair();
  ASSERT_TRUE(client && server);
  EXPECT_TRUE(absl::StartsWith(client->Describe(), "ucx " + listener_->address()))
      << client->Describe();
  EXPECT_TRUE(absl::StartsWith(server->Describe(), "ucx 127.0.0.1:")) << server->Describe();
}

TEST_P(UcxTransportTest, DestroyingTheTransportClosesItsLinks) {
  FrameRecorder at_client;
  FrameRecorder at_server;
  auto [client, server] = ConnectPair();
  ASSERT_TRUE(client && server);
  client->Start(&at_client);
  server->Start(&at_server);
  const std::string block = PatternBytes(16 << 20, 5);
  for (int i = 0; i < 16; ++i) {
    ASSERT_TRUE(client->Send(MakeFrame(FrameType::kChunk, 1, "c", block)).ok());
    ASSERT_TRUE(server->Send(MakeFrame(FrameType::kChunk, 1, "s", block)).ok());
  }
  const absl::Time start = absl::Now();
  client_.reset();  // the link object outlives its transport
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  auto local = at_client.WaitForLinkDown(absl::ZeroDuration());
  ASSERT_TRUE(local.has_value());
  EXPECT_TRUE(absl::IsCancelled(*local)) << *local;
  auto remote = at_server.WaitForLinkDown(absl::Seconds(1));
  ASSERT_TRUE(remote.has_value());
  EXPECT_TRUE(absl::IsUnavailable(*remote)) << *remote;
  EXPECT_TRUE(absl::IsFailedPrecondition(client->Send(MakeFrame(FrameType::kAck, 1, "x"))));
  client->Close();
  client.reset();
  at_client.TakeFrames();
  at_server.TakeFrames();
  server.reset();
  listener_.reset();
  server_.reset();
  EXPECT_EQ(at_client.link_down_calls(), 1);
  EXPECT_EQ(at_server.link_down_calls(), 1);
  EXPECT_EQ(LiveTransportBuffers(), 0);
}

TEST_P(UcxTransportTest, PeerProcessKilledIsDetected) {
  // Re-run this binary as the peer (kRanAsPeer above); exec at once, as the parent has threads.
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  env_strings.push_back(absl::StrCat(kPeerEnv, "=", listener_->address()));
  std::vector<char*> env;
  for (std::string& s : env_strings) env.push_back(s.data());
  env.push_back(nullptr);
  char self[] = "/proc/self/exe";
  char* argv[] = {self, nullptr};
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execve(self, argv, env.data());
    _exit(127);
  }
  FrameRecorder at_server;
  auto server = listener_->Accept(absl::Seconds(10));
  if (!server.ok()) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    FAIL() << server.status();
  }
  (*server)->Start(&at_server);
  EXPECT_TRUE(at_server.WaitForFrames(1, absl::Seconds(5)));
  const absl::Time killed_at = absl::Now();
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  auto down = at_server.WaitForLinkDown(absl::Seconds(5));
  ASSERT_TRUE(down.has_value()) << "a killed peer went unnoticed for 5 s";
  std::printf("[ %s ] killed peer noticed after %s: %s\n", GetParam().name,
              absl::FormatDuration(absl::Now() - killed_at).c_str(), down->ToString().c_str());
  EXPECT_TRUE(absl::IsUnavailable(*down)) << *down;
  EXPECT_TRUE(absl::StrContains(down->message(), "peer")) << *down;
  EXPECT_TRUE(absl::IsFailedPrecondition((*server)->Send(MakeFrame(FrameType::kAck, 1, "x"))));
  server->reset();  // its threads joined: no handler call can come after this
  EXPECT_EQ(at_server.link_down_calls(), 1);
  at_server.TakeFrames();
}

// `n` bytes of pattern in 2 MiB-aligned memory advised for transparent huge pages, as
// ucx_perftest's own buffers are (its "thp" allocation), so the comparison is like for like.
struct HugeBlock {
  explicit HugeBlock(size_t n) : size(n) {
    constexpr size_t kHugePage = size_t{2} << 20;
    if (posix_memalign(&data, kHugePage, n) != 0) data = nullptr;
    if (data == nullptr) return;
    madvise(data, n, MADV_HUGEPAGE);
    const std::string pattern = PatternBytes(n, 1);
    std::memcpy(data, pattern.data(), n);
  }
  ~HugeBlock() { free(data); }
  HugeBlock(const HugeBlock&) = delete;
  HugeBlock& operator=(const HugeBlock&) = delete;
  Payload View() const { return Payload(static_cast<const uint8_t*>(data), size, nullptr); }
  void* data = nullptr;
  size_t size;
};

// Not an assertion: prints the goodput of back-to-back data frames (several in flight) to compare
// with `ucx_perftest -t ucp_am_bw` over the same UCX_TLS (both report MiB/s).
TEST_P(UcxTransportTest, BandwidthPrint) {
  CountingHandler at_server;
  auto [client, server] = ConnectPair();
  ASSERT_TRUE(client && server);
  server->Start(&at_server);
  std::printf("[ %s ] %s\n", GetParam().name, client->Describe().c_str());
  int64_t sent = 0;
  auto run = [&](size_t frame_bytes, int frames) {
    const HugeBlock block(frame_bytes);
    EXPECT_NE(block.data, nullptr);
    const absl::Time start = absl::Now();
    for (int i = 0; i < frames; ++i) {
      Frame frame;
      frame.type = FrameType::kChunk;
      frame.payload = block.View();
      EXPECT_TRUE(client->Send(std::move(frame)).ok());
    }
    sent += frames;
    EXPECT_TRUE(at_server.WaitForFrames(sent, absl::Seconds(60)));
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    return static_cast<double>(frame_bytes) * frames / seconds / (1 << 20);
  };
  for (auto [frame_bytes, frames] :
       {std::pair<size_t, int>{1 << 20, 2048}, std::pair<size_t, int>{4 << 20, 512},
        std::pair<size_t, int>{64 << 20, 32}}) {
    // Warm-up: the receiver's pool grows to the buffers of this size it needs in flight (perftest
    // measures with its buffers allocated, too).
    run(frame_bytes, frame_bytes >= (64 << 20) ? 12 : 64);
    const double mibps = run(frame_bytes, frames);
    std::printf("[ %s ] %zu MiB frames x %d: %.0f MiB/s\n", GetParam().name, frame_bytes >> 20,
                frames, mibps);
  }
}

INSTANTIATE_TEST_SUITE_P(Tls, UcxTransportTest,
                         ::testing::Values(Tls{"tcp", "tcp"}, Tls{"shm", "posix,cma,self"}),
                         [](const ::testing::TestParamInfo<Tls>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace scd::transport
