// The Link contract (transport/transport.h), one test over every backend: in-process, gRPC, and
// UCX over tcp and over shared memory. Data frames of 0 B .. 8 MiB arrive in order with exact
// bytes both ways while control frames are carried on their own lane and overtake queued data;
// frames that arrive before Start are held; Close reaches both handlers exactly once, also while
// the transport shuts down on another thread; a handler
// may send on and close its own link (its OnLinkDown comes after the call returns); DropSession
// drops only that session's queued data frames, and reaches the backend through every wrapper;
// connecting to nobody and accepting with nobody connecting fail as documented; no transport
// buffer outlives the links.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "tests/transport_test_util.h"
#include "transport/fault_injection.h"
#include "transport/link_shaper.h"
#include "transport/transport.h"

namespace scd::transport {
namespace {

using ::scd::testing::FrameRecorder;
using ::scd::testing::FrameScript;
using ::scd::testing::PatternBytes;
using ::scd::testing::SettledLiveBuffers;
using ::scd::testing::ValidChunk;
using ::scd::testing::ValidControl;
using ::scd::testing::ValidHeader;

constexpr size_t kMiB = size_t{1} << 20;

struct Backend {
  const char* name;     // test name
  const char* backend;  // TransportOptions::backend
  const char* ucx_tls;  // UCX_TLS for ucx, else null
};

// Blocks in its first OnFrame until released (the receiver stalls, so the sender's frames queue
// in the backend), then records like FrameRecorder.
class StallingRecorder : public FrameRecorder {
 public:
  void OnFrame(Frame frame) override {
    if (!first_seen_.HasBeenNotified()) {
      first_seen_.Notify();
      release_.WaitForNotification();
    }
    FrameRecorder::OnFrame(std::move(frame));
  }
  void WaitUntilStalled() { first_seen_.WaitForNotificationWithTimeout(absl::Seconds(10)); }
  void Release() {
    if (!release_.HasBeenNotified()) release_.Notify();
  }
  ~StallingRecorder() override { Release(); }

 private:
  absl::Notification first_seen_, release_;
};

// Echoes every frame on its own link; closes it on a trailer. Its OnLinkDown must come after the
// OnFrame that closed the link has returned, and nothing after it.
class EchoThenClose : public LinkHandler {
 public:
  void set_link(Link* link) { link_ = link; }
  void OnFrame(Frame frame) override {
    EXPECT_EQ(downs_.load(), 0) << "a frame after OnLinkDown";
    inside_ = true;
    if (frame.type == FrameType::kTrailer) {
      link_->Close();
      EXPECT_EQ(downs_.load(), 0) << "OnLinkDown re-entered the handler";
    } else {
      EXPECT_TRUE(link_->Send(std::move(frame)).ok());
    }
    inside_ = false;
  }
  void OnLinkDown(absl::Status status) override {
    EXPECT_FALSE(inside_.load()) << "OnLinkDown inside OnFrame";
    EXPECT_TRUE(absl::IsCancelled(status)) << status;
    ++downs_;
  }
  std::atomic<int> downs_{0};

 private:
  Link* link_ = nullptr;
  std::atomic<bool> inside_{false};
};

class LinkContractTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (GetParam().ucx_tls != nullptr) setenv("UCX_TLS", GetParam().ucx_tls, 1);
    MakeTransports();
  }

  // Server and client transports (new ones: the old ones and their links go first), listening.
  void MakeTransports() {
    client_.reset();
    server_.reset();
    listener_.reset();
    client_transport_.reset();
    server_transport_.reset();
    TransportOptions options;
    options.backend = GetParam().backend;
    auto server = CreateTransport(options);
    if (!server.ok() && absl::IsUnimplemented(server.status())) GTEST_SKIP() << server.status();
    ASSERT_TRUE(server.ok()) << server.status();
    server_transport_ = *std::move(server);
    auto client = CreateTransport(options);
    ASSERT_TRUE(client.ok()) << client.status();
    client_transport_ = *std::move(client);
    auto listener = server_transport_->Listen(
        std::string(GetParam().backend) == "inproc" ? "contract:0" : "127.0.0.1:0");
    ASSERT_TRUE(listener.ok()) << listener.status();
    listener_ = *std::move(listener);
  }

  void TearDown() override {
    stalled_.Release();  // a stalled delivery thread must finish before its link can go
    client_.reset();
    server_.reset();
    listener_.reset();
    client_transport_.reset();
    server_transport_.reset();
    if (GetParam().ucx_tls != nullptr) unsetenv("UCX_TLS");
    client_got_.TakeFrames();  // what the handlers kept
    server_got_.TakeFrames();
    stalled_.TakeFrames();
    EXPECT_EQ(SettledLiveBuffers(), 0);
  }

  // Connects client_ to the listener and accepts server_.
  void Connect() {
    auto client = client_transport_->Connect(listener_->address(), absl::Seconds(5));
    ASSERT_TRUE(client.ok()) << client.status();
    auto server = listener_->Accept(absl::Seconds(5));
    ASSERT_TRUE(server.ok()) << server.status();
    client_ = *std::move(client);
    server_ = *std::move(server);
  }

  // Close on one side: the closer's handler hears Cancelled before Close returns, the peer's
  // hears Unavailable within a second, each exactly once; neither side can send afterwards.
  // `client_got`, `server_got`: the handlers (the fixture's by default).
  void CheckCloseReachesBothHandlersOnce(bool client_closes, FrameRecorder& client_got,
                                         FrameRecorder& server_got);

  // Runs `round` `rounds` times, each on new transports with handlers of its own (the links go
  // before them), stopping at a fatal failure.
  template <typename Round>
  void OnNewTransports(int rounds, const Round& round) {
    for (int i = 0; i < rounds && !HasFatalFailure(); ++i) {
      SCOPED_TRACE(absl::StrCat("round ", i));
      FrameRecorder client_got, server_got;
      absl::Cleanup drop_links = [this] {
        client_.reset();
        server_.reset();
      };
      MakeTransports();
      if (HasFatalFailure()) return;
      round(i, client_got, server_got);
    }
  }

  // Handlers outlive the links (TearDown destroys the links first).
  FrameRecorder client_got_, server_got_;
  StallingRecorder stalled_;
  EchoThenClose echo_;
  std::unique_ptr<Transport> server_transport_, client_transport_;
  std::unique_ptr<Listener> listener_;
  std::unique_ptr<Link> client_, server_;
};

TEST_P(LinkContractTest, DataInOrderExactBothWaysControlOnItsOwnLane) {
  Connect();
  client_->Start(&client_got_);
  server_->Start(&server_got_);
  const FrameScript to_server = testing::MakeFrameScript(1);
  const FrameScript to_client = testing::MakeFrameScript(2);
  std::thread server_sender([&] { testing::SendFrameScript(server_.get(), to_client); });
  testing::SendFrameScript(client_.get(), to_server);
  server_sender.join();
  ASSERT_TRUE(server_got_.WaitForFrames(to_server.frames(), absl::Seconds(60)));
  ASSERT_TRUE(client_got_.WaitForFrames(to_client.frames(), absl::Seconds(60)));
  testing::CheckFrameScript(server_got_.TakeFrames(), to_server);
  testing::CheckFrameScript(client_got_.TakeFrames(), to_client);
  EXPECT_EQ(client_got_.link_down_calls(), 0);
  EXPECT_EQ(server_got_.link_down_calls(), 0);
}

// The receiver stalls in its first OnFrame while 48 MiB of chunks queue behind it; a control frame
// sent after all of them is delivered before the last of them.
TEST_P(LinkContractTest, ControlFrameOvertakesQueuedData) {
  StallingRecorder& got = stalled_;
  Connect();
  server_->Start(&got);
  const std::string bytes = PatternBytes(kMiB, 7);
  const Payload payload = Payload::Copy(bytes.data(), bytes.size());
  for (uint32_t i = 0; i < 48; ++i) ASSERT_TRUE(client_->Send(ValidChunk(9, i, payload)).ok());
  got.WaitUntilStalled();
  ASSERT_TRUE(client_->Send(ValidControl(FrameType::kCredit, 9, 12345)).ok());
  // waits: the credit to reach the stalled receiver's backend: a frame queued there is visible to
  //  nobody until delivered; 100 ms is ~1,000x loopback latency
  absl::SleepFor(absl::Milliseconds(100));
  got.Release();
  ASSERT_TRUE(got.WaitForFrames(49, absl::Seconds(30)));
  std::vector<Frame> frames = got.TakeFrames();
  size_t credit_at = frames.size();
  uint32_t next_index = 0;
  for (size_t i = 0; i < frames.size(); ++i) {
    if (frames[i].type == FrameType::kCredit) {
      credit_at = i;
      continue;
    }
    v1::TransferFrame meta;
    ASSERT_TRUE(meta.ParseFromString(frames[i].meta));
    EXPECT_EQ(meta.chunk().index(), next_index++);
    EXPECT_TRUE(frames[i].payload.view() == bytes);
  }
  EXPECT_EQ(next_index, 48u);
  EXPECT_LT(credit_at, 48u) << "the credit waited behind every queued chunk";
}

TEST_P(LinkContractTest, FramesArrivingBeforeStartAreHeld) {
  FrameRecorder& got = server_got_;
  Connect();
  const std::string bytes = PatternBytes(3 * kMiB + 11, 3);
  ASSERT_TRUE(client_->Send(ValidHeader(4, 1)).ok());
  ASSERT_TRUE(client_->Send(ValidChunk(4, 0, Payload::Copy(bytes.data(), bytes.size()))).ok());
  ASSERT_TRUE(client_->Send(ValidControl(FrameType::kHeartbeat, 0, 1)).ok());
  // waits: the frames to reach the link before Start (no handler: nothing can tell); Start before
  //  they arrive tests less but still passes
  absl::SleepFor(absl::Milliseconds(200));
  server_->Start(&got);
  ASSERT_TRUE(got.WaitForFrames(3, absl::Seconds(5)));
  std::vector<Frame> frames = got.TakeFrames();
  ASSERT_EQ(frames.size(), 3u);
  std::vector<FrameType> data;
  for (const Frame& frame : frames) {
    if (!IsControl(frame.type)) data.push_back(frame.type);
    if (frame.type == FrameType::kChunk) {
      EXPECT_TRUE(frame.payload.view() == bytes);
    }
  }
  EXPECT_EQ(data, std::vector<FrameType>({FrameType::kHeader, FrameType::kChunk}));
}

void LinkContractTest::CheckCloseReachesBothHandlersOnce(bool client_closes,
                                                         FrameRecorder& client_got,
                                                         FrameRecorder& server_got) {
  Connect();
  client_->Start(&client_got);
  server_->Start(&server_got);
  Link* closer = client_closes ? client_.get() : server_.get();
  Link* peer = client_closes ? server_.get() : client_.get();
  FrameRecorder& closer_got = client_closes ? client_got : server_got;
  FrameRecorder& peer_got = client_closes ? server_got : client_got;
  // Bulk data in flight both ways, so that closing has something to cut short.
  const std::string bytes = PatternBytes(4 * kMiB, 5);
  const Payload payload = Payload::Copy(bytes.data(), bytes.size());
  for (uint32_t i = 0; i < 8; ++i) {
    ASSERT_TRUE(closer->Send(ValidChunk(2, i, payload)).ok());
    ASSERT_TRUE(peer->Send(ValidChunk(3, i, payload)).ok());
  }
  const absl::Time start = absl::Now();
  closer->Close();
  EXPECT_EQ(closer_got.link_down_calls(), 1) << "Close returned before the handler heard it";
  std::optional<absl::Status> local = closer_got.WaitForLinkDown(absl::ZeroDuration());
  ASSERT_TRUE(local.has_value());
  EXPECT_TRUE(absl::IsCancelled(*local)) << *local;
  std::optional<absl::Status> remote = peer_got.WaitForLinkDown(absl::Seconds(1));
  ASSERT_TRUE(remote.has_value()) << "peer not told within 1 s";
  EXPECT_TRUE(absl::IsUnavailable(*remote)) << *remote;
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_TRUE(absl::IsFailedPrecondition(closer->Send(ValidControl(FrameType::kCredit, 2, 1))));
  // The peer heard it: it cannot send either.
  EXPECT_TRUE(absl::IsFailedPrecondition(peer->Send(ValidControl(FrameType::kCredit, 3, 1))));
  closer->Close();  // idempotent
  peer->Close();
  client_.reset();
  server_.reset();
  EXPECT_EQ(client_got.link_down_calls(), 1);
  EXPECT_EQ(server_got.link_down_calls(), 1);
}

TEST_P(LinkContractTest, ClientCloseReachesBothHandlersOnce) {
  CheckCloseReachesBothHandlersOnce(true, client_got_, server_got_);
}

TEST_P(LinkContractTest, ServerCloseReachesBothHandlersOnce) {
  CheckCloseReachesBothHandlersOnce(false, client_got_, server_got_);
}

// The close above 20 times in a row, each side in turn, each time on new transports: no process
// goes down. Over ucx_tcp with UCX 1.13's defaults (tcp PUT, zero-copy sends) libuct aborted the
// process in 1 of 2 server closes on an idle machine (tcp_ep.c:939; transport/ucx/ucx_config.cc
// KeepTcpOffZeroCopy); an abort ends this whole binary.
TEST_P(LinkContractTest, ClosingMidTransferNeverTakesAProcessDown) {
  OnNewTransports(20, [this](int round, FrameRecorder& client_got, FrameRecorder& server_got) {
    CheckCloseReachesBothHandlersOnce(round % 2 == 1, client_got, server_got);
  });
}

// A link closed while its transport shuts down on another thread: when Close returns its handler
// has heard OnLinkDown, once, and hears nothing after (its owner may free it then). UCX's Close
// used to return without it when the progress thread had stopped taking commands, and the
// shutdown then called the freed handler (a SIGSEGV in transfer_session_test under load,
// 2026-12-01; transport/ucx/ucx_handshake.cc TellHandlerHere).
TEST_P(LinkContractTest, ACloseRacingTheTransportsShutdownStillTellsTheHandlerFirst) {
  OnNewTransports(30, [this](int round, FrameRecorder& client_got, FrameRecorder& server_got) {
    Connect();
    client_->Start(&client_got);
    server_->Start(&server_got);
    std::thread shutdown([this] { client_transport_.reset(); });
    // paces: where the race falls -- the Close at once or up to 1.5 ms into the shutdown.
    if (round % 2 == 1) absl::SleepFor(absl::Microseconds(50 * round));
    client_->Close();
    const int heard = client_got.link_down_calls();
    shutdown.join();
    EXPECT_EQ(heard, 1) << "Close returned before the handler heard its end";
    client_.reset();
    EXPECT_EQ(client_got.link_down_calls(), 1) << "a call after Close returned";
  });
}

TEST_P(LinkContractTest, HandlerMaySendOnAndCloseItsOwnLink) {
  FrameRecorder& client_got = client_got_;
  EchoThenClose& echo = echo_;
  Connect();
  echo.set_link(server_.get());
  client_->Start(&client_got);
  server_->Start(&echo);
  std::vector<std::string> sent;
  for (uint32_t i = 0; i < 10; ++i) {
    sent.push_back(PatternBytes(i % 2 ? 100000 : 100, i));
    ASSERT_TRUE(
        client_->Send(ValidChunk(1, i, Payload::Copy(sent[i].data(), sent[i].size()))).ok());
  }
  ASSERT_TRUE(client_got.WaitForFrames(10, absl::Seconds(10)));
  std::vector<Frame> echoes = client_got.TakeFrames();
  for (uint32_t i = 0; i < 10; ++i) EXPECT_TRUE(echoes[i].payload.view() == sent[i]) << i;
  ASSERT_TRUE(client_->Send(testing::ValidTrailer(1, 10, 0)).ok());
  std::optional<absl::Status> down = client_got.WaitForLinkDown(absl::Seconds(2));
  ASSERT_TRUE(down.has_value());
  EXPECT_TRUE(absl::IsUnavailable(*down)) << *down;
  server_.reset();  // waits for anything still running on the link's thread
  EXPECT_EQ(echo.downs_.load(), 1);
}

// The receiver stalls while sessions 1 and 2 queue interleaved chunks (and session 1 control
// frames); DropSession(1) drops session 1's queued data only: the receiver then gets a prefix of
// session 1's chunks, every chunk of session 2 in order, and every control frame.
TEST_P(LinkContractTest, DropSessionDropsOnlyThatSessionsQueuedData) {
  StallingRecorder& got = stalled_;
  Connect();
  server_->Start(&got);
  const std::string bytes = PatternBytes(kMiB, 9);
  const Payload payload = Payload::Copy(bytes.data(), bytes.size());
  constexpr uint32_t kPerSession = 24;
  for (uint32_t i = 0; i < kPerSession; ++i) {
    ASSERT_TRUE(client_->Send(ValidChunk(1, i, payload)).ok());
    ASSERT_TRUE(client_->Send(ValidChunk(2, i, payload)).ok());
  }
  got.WaitUntilStalled();
  ASSERT_TRUE(client_->Send(ValidControl(FrameType::kCancel, 1, 1)).ok());
  client_->DropSession(1);
  ASSERT_TRUE(client_->Send(ValidControl(FrameType::kHeartbeat, 1, 2)).ok());
  ASSERT_TRUE(client_->Send(ValidChunk(3, 0, payload)).ok());  // a later session still goes
  got.Release();
  ASSERT_TRUE(got.WaitForFrames(kPerSession + 3, absl::Seconds(30)));
  // Data keeps its order: once session 3's chunk is here, what of session 1 still came came.
  ASSERT_TRUE(got.WaitForSession(3, absl::Seconds(30)));
  std::vector<uint32_t> first, second;
  int control = 0, third = 0;
  for (const Frame& frame : got.TakeFrames()) {
    if (IsControl(frame.type)) {
      ++control;
      continue;
    }
    v1::TransferFrame meta;
    ASSERT_TRUE(meta.ParseFromString(frame.meta));
    if (frame.session_id == 1) first.push_back(meta.chunk().index());
    if (frame.session_id == 2) second.push_back(meta.chunk().index());
    if (frame.session_id == 3) ++third;
  }
  EXPECT_EQ(control, 2);
  EXPECT_EQ(third, 1);
  ASSERT_EQ(second.size(), kPerSession);
  for (uint32_t i = 0; i < kPerSession; ++i) EXPECT_EQ(second[i], i);
  EXPECT_LT(first.size(), kPerSession) << "DropSession dropped nothing of session 1";
  for (uint32_t i = 0; i < first.size(); ++i) EXPECT_EQ(first[i], i) << "not a prefix";
}

// DropSession on a stack of decorators reaches the backend's queue below them.
TEST_P(LinkContractTest, DropSessionReachesTheBackendThroughEveryWrapper) {
  StallingRecorder& got = stalled_;
  Connect();
  server_->Start(&got);
  LinkShape unlimited_but_on;
  unlimited_but_on.latency = absl::Microseconds(1);  // enabled: a ShapedLink in the stack
  std::unique_ptr<Link> wrapped = ShapeLink(
      std::make_unique<FaultInjectingLink>(std::move(client_), FaultPolicy{}), unlimited_but_on);
  const std::string bytes = PatternBytes(kMiB, 4);
  const Payload payload = Payload::Copy(bytes.data(), bytes.size());
  for (uint32_t i = 0; i < 32; ++i) ASSERT_TRUE(wrapped->Send(ValidChunk(5, i, payload)).ok());
  got.WaitUntilStalled();
  // waits: the frames to leave the 1-us shaper for the backend (its queue is not observable); if
  //  some are still in it, DropSession drops them there and the test still holds
  absl::SleepFor(absl::Milliseconds(50));
  wrapped->DropSession(5);
  ASSERT_TRUE(wrapped->Send(ValidChunk(6, 0, payload)).ok());
  got.Release();
  // Data keeps its order: once session 6's chunk is here, what of session 5 still came came.
  ASSERT_TRUE(got.WaitForSession(6, absl::Seconds(10)));
  size_t of_five = 0;
  bool six = false;
  for (const Frame& frame : got.TakeFrames()) {
    of_five += frame.session_id == 5;
    six |= frame.session_id == 6;
  }
  EXPECT_TRUE(six);
  EXPECT_LT(of_five, 32u) << "the backend below the wrappers kept every queued frame";
  wrapped.reset();  // before the handler; client_ went into it
}

TEST_P(LinkContractTest, NobodyToConnectToOrToAccept) {
  EXPECT_TRUE(absl::IsDeadlineExceeded(listener_->Accept(absl::Milliseconds(50)).status()));
  std::thread closer([&] {
    // waits: Accept to be blocked when Close comes (no event says a thread is blocked); a Close
    //  before it ends Accept the same way
    absl::SleepFor(absl::Milliseconds(50));
    listener_->Close();
  });
  EXPECT_TRUE(absl::IsCancelled(listener_->Accept(absl::Seconds(5)).status()));
  closer.join();
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<Link>> link =
      client_transport_->Connect(listener_->address(), absl::Seconds(2));
  EXPECT_TRUE(absl::IsUnavailable(link.status())) << link.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

INSTANTIATE_TEST_SUITE_P(Backends, LinkContractTest,
                         ::testing::Values(Backend{"inproc", "inproc", nullptr},
                                           Backend{"grpc", "grpc", nullptr},
                                           Backend{"ucx_tcp", "ucx", "tcp"},
                                           Backend{"ucx_shm", "ucx", "posix,cma,self"}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace scd::transport
