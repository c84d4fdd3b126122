// The UCX backend, once over UCX_TLS=tcp and once over shared memory (posix,cma,self): data frames
// of 0 bytes .. 8 MiB (eager and rendezvous) arrive in order with exact bytes in both directions,
// control frames arrive at once and overtake a long data queue, frames sent before Start are held,
// Close and peer death reach the other side exactly once, connecting to nobody fails fast, and no
// transport buffer outlives the links. A rough bandwidth print compares with ucx_perftest.
#include "transport/ucx_transport.h"

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

// A payload view of `bytes`, which the caller keeps alive (zero-copy sends of one buffer).
Payload View(const std::string& bytes) {
  return Payload(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), nullptr);
}

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

constexpr size_t kSizes[] = {0,     1,     7,      100,     4096,          65535,
                             65536, 65537, 300000, 1 << 20, (3 << 20) + 5, 8 << 20};
constexpr int kDataFrames = 200;

std::string DataMeta(uint32_t salt, int i) {
  std::string meta = absl::StrCat("data ", salt, " ", i);
  // Every 50th frame's meta is too large for an AM header and travels in the AM data.
  if (i % 50 == 7) meta.append(std::string(20000, static_cast<char>('a' + i % 26)));
  return meta;
}

FrameType DataType(int i) {
  return i % 3 == 0 ? FrameType::kHeader : (i % 3 == 1 ? FrameType::kChunk : FrameType::kTrailer);
}

void SendMixed(Link* link, uint32_t salt) {
  for (int i = 0; i < kDataFrames; ++i) {
    const size_t size = kSizes[i % std::size(kSizes)];
    ASSERT_TRUE(link->Send(MakeFrame(DataType(i), 1000 + i, DataMeta(salt, i),
                                     PatternBytes(size, salt * 1000 + i)))
                    .ok());
    if (i % 4 == 3) {
      ASSERT_TRUE(
          link->Send(MakeFrame(FrameType::kCredit, i, absl::StrCat("control ", salt, " ", i)))
              .ok());
    }
  }
}

void CheckMixed(const std::vector<Frame>& frames, uint32_t salt) {
  int data = 0;
  std::set<std::string> control;
  for (const Frame& frame : frames) {
    if (IsControl(frame.type)) {
      EXPECT_EQ(frame.type, FrameType::kCredit);
      control.insert(frame.meta);
      continue;
    }
    ASSERT_LT(data, kDataFrames);
    const size_t size = kSizes[data % std::size(kSizes)];
    EXPECT_EQ(frame.type, DataType(data)) << data;
    EXPECT_EQ(frame.session_id, 1000u + data);
    EXPECT_EQ(frame.meta, DataMeta(salt, data));
    ASSERT_EQ(frame.payload.size(), size) << "data frame " << data;
    EXPECT_TRUE(frame.payload.view() == PatternBytes(size, salt * 1000 + data))
        << "bytes of data frame " << data << " (" << size << " bytes)";
    ++data;
  }
  EXPECT_EQ(data, kDataFrames);
  EXPECT_EQ(control.size(), static_cast<size_t>(kDataFrames / 4));
  for (int i = 3; i < kDataFrames; i += 4) {
    EXPECT_EQ(control.count(absl::StrCat("control ", salt, " ", i)), 1u) << i;
  }
}

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

TEST_P(UcxTransportTest, OrderedExactFramesBothDirections) {
  FrameRecorder at_client;
  FrameRecorder at_server;
  auto [client, server] = ConnectPair();
  ASSERT_TRUE(client && server);
  client->Start(&at_client);
  server->Start(&at_server);
  std::thread to_server([&, link = client.get()] { SendMixed(link, 1); });
  std::thread to_client([&, link = server.get()] { SendMixed(link, 2); });
  to_server.join();
  to_client.join();
  const size_t expected = kDataFrames + kDataFrames / 4;
  ASSERT_TRUE(at_server.WaitForFrames(expected, absl::Seconds(30))) << at_server.frame_count();
  ASSERT_TRUE(at_client.WaitForFrames(expected, absl::Seconds(30))) << at_client.frame_count();
  CheckMixed(at_server.TakeFrames(), 1);
  CheckMixed(at_client.TakeFrames(), 2);
  EXPECT_EQ(at_server.link_down_calls(), 0);
}

TEST_P(UcxTransportTest, ControlFrameOvertakesQueuedData) {
  FrameRecorder at_server;
  auto [client, server] = ConnectPair();
  ASSERT_TRUE(client && server);
  server->Start(&at_server);
  const std::string block = PatternBytes(4 << 20, 7);
  constexpr int kBlocks = 64;
  for (int i = 0; i < kBlocks; ++i) {
    Frame frame;
    frame.type = FrameType::kChunk;
    frame.session_id = 1;
    frame.meta = absl::StrCat(i);
    frame.payload = View(block);
    ASSERT_TRUE(client->Send(std::move(frame)).ok());
  }
  ASSERT_TRUE(client->Send(MakeFrame(FrameType::kCancel, 1, "stop")).ok());
  ASSERT_TRUE(at_server.WaitForFrames(kBlocks + 1, absl::Seconds(30)));
  std::vector<Frame> frames = at_server.TakeFrames();
  int control_at = -1;
  int data = 0;
  for (size_t i = 0; i < frames.size(); ++i) {
    if (frames[i].type == FrameType::kCancel) {
      control_at = static_cast<int>(i);
    } else {
      EXPECT_EQ(frames[i].meta, absl::StrCat(data)) << "data frames out of order";
      ++data;
    }
  }
  std::printf("[ %s ] the control frame arrived after %d of %d queued 4 MiB data frames\n",
              GetParam().name, control_at, kBlocks);
  ASSERT_GE(control_at, 0);
  EXPECT_LT(control_at, kBlocks) << "the control frame waited behind every data frame";
  EXPECT_EQ(data, kBlocks);
}

TEST_P(UcxTransportTest, FramesBeforeStartAreHeld) {
  FrameRecorder at_server;
  auto [client, server] = ConnectPair();
  ASSERT_TRUE(client && server);
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(client
                    ->Send(MakeFrame(FrameType::kChunk, 5, absl::StrCat(i),
                                     PatternBytes(i % 2 ? 200000 : 10, i)))
                    .ok());
  }
  ASSERT_TRUE(client->Send(MakeFrame(FrameType::kAck, 5, "ack")).ok());
  absl::SleepFor(absl::Milliseconds(200));  // everything has arrived by now, and is held
  EXPECT_EQ(at_server.frame_count(), 0u);
  server->Start(&at_server);
  ASSERT_TRUE(at_server.WaitForFrames(21, absl::Seconds(10)));
  std::vector<Frame> frames = at_server.TakeFrames();
  int data = 0;
  for (const Frame& frame : frames) {
    if (frame.type == FrameType::kAck) continue;
    EXPECT_EQ(frame.meta, absl::StrCat(data));
    EXPECT_TRUE(frame.payload.view() == PatternBytes(data % 2 ? 200000 : 10, data));
    ++data;
  }
  EXPECT_EQ(data, 20);
}

TEST_P(UcxTransportTest, CloseReachesPeerOnce) {
  FrameRecorder at_client;
  FrameRecorder at_server;
  auto [client, server] = ConnectPair();
  ASSERT_TRUE(client && server);
  client->Start(&at_client);
  server->Start(&at_server);
  // Traffic in flight in both directions while the link closes: every payload must be released.
  const std::string block = PatternBytes(8 << 20, 3);
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(client->Send(MakeFrame(FrameType::kChunk, 1, "c", block)).ok());
    ASSERT_TRUE(server->Send(MakeFrame(FrameType::kChunk, 1, "s", block)).ok());
  }
  const absl::Time closed_at = absl::Now();
  client->Close();
  // Close returns after the local handler heard of it.
  EXPECT_EQ(at_client.link_down_calls(), 1);
  auto local = at_client.WaitForLinkDown(absl::ZeroDuration());
  ASSERT_TRUE(local.has_value());
  EXPECT_TRUE(absl::IsCancelled(*local)) << *local;
  auto remote = at_server.WaitForLinkDown(absl::Seconds(1));
  ASSERT_TRUE(remote.has_value()) << "the peer did not hear of the close within 1 s";
  std::printf("[ %s ] the peer heard of the close after %s\n", GetParam().name,
              absl::FormatDuration(absl::Now() - closed_at).c_str());
  EXPECT_TRUE(absl::IsUnavailable(*remote)) << *remote;
  EXPECT_TRUE(absl::StrContains(remote->message(), "peer closed the link")) << *remote;
  EXPECT_TRUE(absl::IsFailedPrecondition(client->Send(MakeFrame(FrameType::kAck, 1, "x"))));
  EXPECT_TRUE(absl::IsFailedPrecondition(server->Send(MakeFrame(FrameType::kAck, 1, "x"))));
  client->Close();  // idempotent
  server->Close();
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(at_client.link_down_calls(), 1);
  EXPECT_EQ(at_server.link_down_calls(), 1);
  const size_t frames_after_down = at_server.frame_count();
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(at_server.frame_count(), frames_after_down);
  at_client.TakeFrames();
  at_server.TakeFrames();
  client.reset();
  server.reset();
  listener_.reset();
  client_.reset();
  server_.reset();
  EXPECT_EQ(LiveTransportBuffers(), 0);
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

// Handlers run on the transport's progress thread; they may Send and Close from there.
class EchoThenCloseHandler : public LinkHandler {
 public:
  void set_link(Link* link) { link_ = link; }
  void OnFrame(Frame frame) override {
    if (frame.meta == "close") {
      link_->Close();  // from inside the handler: OnLinkDown comes before Close returns
      EXPECT_EQ(down_calls_.load(), 1);
      return;
    }
    frame.meta = "echo " + frame.meta;
    EXPECT_TRUE(link_->Send(std::move(frame)).ok());
  }
  void OnLinkDown(absl::Status status) override {
    EXPECT_TRUE(absl::IsCancelled(status)) << status;
    ++down_calls_;
  }
  std::atomic<int> down_calls_{0};

 private:
  Link* link_ = nullptr;
};

TEST_P(UcxTransportTest, HandlerMaySendAndClose) {
  FrameRecorder at_client;
  EchoThenCloseHandler at_server;
  auto [client, server] = ConnectPair();
  ASSERT_TRUE(client && server);
  at_server.set_link(server.get());
  client->Start(&at_client);
  server->Start(&at_server);
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(client
                    ->Send(MakeFrame(FrameType::kChunk, 1, absl::StrCat(i),
                                     PatternBytes(i % 2 ? 100000 : 100, i)))
                    .ok());
  }
  ASSERT_TRUE(at_client.WaitForFrames(10, absl::Seconds(10)));
  std::vector<Frame> echoes = at_client.TakeFrames();
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(echoes[i].meta, absl::StrCat("echo ", i));
    EXPECT_TRUE(echoes[i].payload.view() == PatternBytes(i % 2 ? 100000 : 100, i));
  }
  ASSERT_TRUE(client->Send(MakeFrame(FrameType::kTrailer, 1, "close")).ok());
  auto down = at_client.WaitForLinkDown(absl::Seconds(1));
  ASSERT_TRUE(down.has_value());
  EXPECT_TRUE(absl::IsUnavailable(*down)) << *down;
  // ~Link waits for the handler's own Close to finish on the progress thread.
  server.reset();
  EXPECT_EQ(at_server.down_calls_.load(), 1);
}

TEST_P(UcxTransportTest, ConnectToNobodyIsUnavailable) {
  // A port that was free a moment ago.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t length = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length), 0);
  close(fd);
  const std::string address = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
  const absl::Time start = absl::Now();
  auto link = client_->Connect(address, absl::Seconds(2));
  const absl::Duration took = absl::Now() - start;
  ASSERT_FALSE(link.ok());
  EXPECT_TRUE(absl::IsUnavailable(link.status())) << link.status();
  EXPECT_TRUE(absl::StrContains(link.status().message(), address)) << link.status();
  EXPECT_LT(took, absl::Milliseconds(2500));
  std::printf("[ %s ] connect to nobody: %s after %s\n", GetParam().name,
              link.status().ToString().c_str(), absl::FormatDuration(took).c_str());
  EXPECT_TRUE(absl::IsInvalidArgument(client_->Connect("no-port", absl::Seconds(1)).status()));
}

TEST_P(UcxTransportTest, AcceptTimesOutAndIsCancelledByClose) {
  auto none = listener_->Accept(absl::Milliseconds(50));
  EXPECT_TRUE(absl::IsDeadlineExceeded(none.status())) << none.status();
  std::thread closer([&] {
    absl::SleepFor(absl::Milliseconds(50));
    listener_->Close();
  });
  auto cancelled = listener_->Accept(absl::Seconds(5));
  closer.join();
  EXPECT_TRUE(absl::IsCancelled(cancelled.status())) << cancelled.status();
  EXPECT_FALSE(client_->Connect(listener_->address(), absl::Seconds(1)).ok());
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
  absl::SleepFor(absl::Milliseconds(100));
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
