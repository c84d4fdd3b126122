// The link shaper: measured goodput through a shaped in-process link is within 5 % of the setting
// at 0.1, 1 and 10 Gbit/s; latency delays every frame by the setting; control frames
// overtake queued data frames; a dropped session's queued frames are released at once and the
// frames behind them move up; a new rate reaches the frames already queued (a drop slows them, a
// rise speeds them), as a real link's rate change reaches a transfer under way; a frame due at once
// with nothing ahead of it reaches the inner link on the sender's own thread, and frames keep
// their order whichever thread hands them over.
#include "transport/link_shaper.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "tests/transport_test_util.h"
#include "transport/session_acceptor.h"
#include "transport/transfer_session.h"

namespace scd::transport {
namespace {

using ::scd::testing::FrameRecorder;
using ::scd::testing::MakeFrame;

// Goodput the receiver measures for `total` bytes in 1 MiB chunks through a link shaped at `gbps`.
double MeasuredGoodput(double gbps, size_t total) {
  auto transport = *CreateTransport({});
  auto listener = *transport->Listen("shaper:0");
  SessionAcceptor acceptor(std::move(listener), {});
  ConnectionOptions options;
  options.shape.gbps = gbps;
  auto connection = TransferConnection::Create(
      *transport->Connect(acceptor.address(), absl::Seconds(1)), options);
  auto session = *connection->StartSession(v1::TransferHeader(), absl::Seconds(60));
  const std::string block(1 << 20, 'x');
  std::thread sender([&] {
    for (size_t sent = 0; sent < total; sent += block.size()) {
      EXPECT_TRUE(
          session
              ->SendChunk(v1::CodeChunk(), Payload(reinterpret_cast<const uint8_t*>(block.data()),
                                                   block.size(), nullptr))
              .ok());
    }
    EXPECT_TRUE(session->Finish().ok());
  });
  auto received = *acceptor.Accept(absl::Seconds(5));
  for (;;) {
    auto chunk = received->Next(absl::Seconds(30));
    EXPECT_TRUE(chunk.ok()) << chunk.status();
    if (!chunk.ok() || !chunk->has_value()) break;
  }
  sender.join();
  EXPECT_EQ(received->stats().bytes, total);
  return received->stats().goodput_gbps();
}

// Each setting moves at least 64 MiB and at least half a second of traffic: a 64 MiB transfer at
// 10 Gbit/s lasts 54 ms, where one late wake-up of the receiver's thread on a loaded 2-core
// machine (3 ms, seen in CI) is already 6 %; over 0.5 s it is under 1 %.
TEST(LinkShaperTest, GoodputOverHalfASecondIsWithinFivePercentOfTheSetting) {
#if defined(__SANITIZE_ADDRESS__)
  // Under AddressSanitizer (`make asan`) the instrumented code itself cannot move 10 Gbit/s.
  const std::vector<double> settings = {0.1, 1.0};
#else
  const std::vector<double> settings = {0.1, 1.0, 10.0};
#endif
  for (double gbps : settings) {
    const size_t half_second = static_cast<size_t>(gbps * 1e9 / 8 * 0.5) >> 20 << 20;
    const size_t total = std::max(size_t{64} << 20, half_second);
    const double measured = MeasuredGoodput(gbps, total);
    std::printf("shaped %.1f Gbit/s, %zu MiB: measured %.4f Gbit/s (%.2f %%)\n", gbps, total >> 20,
                measured, 100.0 * (measured / gbps - 1));
    EXPECT_NEAR(measured, gbps, 0.05 * gbps);
  }
}

TEST(LinkShaperTest, LatencyDelaysEveryFrameAndControlOvertakesData) {
  FrameRecorder recorder, unused;  // the handlers outlive the links
  auto transport = *CreateTransport({});
  auto listener = *transport->Listen("shaper-latency:0");
  LinkShape shape;
  shape.gbps = 0.08;  // 10 MB/s: 10 x 100 KB data frames take ~100 ms
  shape.latency = absl::Milliseconds(30);
  auto sender = ShapeLink(*transport->Connect(listener->address(), absl::Seconds(1)), shape);
  auto receiver = *listener->Accept(absl::Seconds(1));
  receiver->Start(&recorder);
  sender->Start(&unused);
  std::vector<Frame> data;
  for (int i = 0; i < 10; ++i) {
    data.push_back(MakeFrame(FrameType::kChunk, 1, "", std::string(100000, 'd')));
  }
  const absl::Time start = absl::Now();
  for (Frame& frame : data) ASSERT_TRUE(sender->Send(std::move(frame)).ok());
  ASSERT_TRUE(sender->Send(MakeFrame(FrameType::kCredit, 1, "control")).ok());
  ASSERT_TRUE(recorder.WaitForFrames(11, absl::Seconds(2)));
  const absl::Duration all = absl::Now() - start;
  std::vector<Frame> frames = recorder.TakeFrames();
  // The control frame skips the bucket: it arrives after the latency, ahead of most of the data
  // queued before it (each data frame takes 10 ms of the bucket).
  size_t control_at = 0;
  while (control_at < frames.size() && frames[control_at].type != FrameType::kCredit) ++control_at;
  EXPECT_LE(control_at, 2u);
  // 1 MB at 10 MB/s = 100 ms, less the 64 KiB burst (~6.5 ms), plus 30 ms latency.
  EXPECT_GE(all, absl::Milliseconds(115));
  EXPECT_LE(all, absl::Milliseconds(200));
}

TEST(LinkShaperTest, DroppedSessionReleasesItsQueuedFramesAndLaterFramesMoveUp) {
  FrameRecorder recorder, unused;
  auto transport = *CreateTransport({});
  auto listener = *transport->Listen("shaper-drop:0");
  LinkShape shape;
  shape.gbps = 0.008;  // 1 MB/s: each 100 KB frame takes 100 ms of the bucket
  auto sender = ShapeLink(*transport->Connect(listener->address(), absl::Seconds(1)), shape);
  auto receiver = *listener->Accept(absl::Seconds(1));
  receiver->Start(&recorder);
  sender->Start(&unused);
  std::atomic<int> released{0};
  auto frame = [&](uint64_t session) {
    Frame f;
    f.type = FrameType::kChunk;
    f.session_id = session;
    static const std::string bytes(100000, 'd');
    f.payload = Payload::Adopt(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                               [&released] { ++released; });
    return f;
  };
  // Session 1 queues 10 frames (1 s of bucket), then session 2 one frame behind them.
  const absl::Time start = absl::Now();
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(sender->Send(frame(1)).ok());
  ASSERT_TRUE(sender->Send(frame(2)).ok());
  sender->DropSession(1);
  // At most the frame already leaving (inside the burst) was sent; the rest were released now.
  EXPECT_GE(released.load(), 9);
  ASSERT_TRUE(recorder.WaitForSession(2, absl::Seconds(2)));
  std::vector<Frame> frames = recorder.TakeFrames();
  ASSERT_FALSE(frames.empty());
  EXPECT_EQ(frames.back().session_id, 2u);
  EXPECT_LE(frames.size(), 2u);
  // Session 2's frame did not wait for the dropped second of session 1's frames.
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(500));
}

// Sends `frames` x 100 KB through a link shaped at `from_gbps`, switches it to `to_gbps` right
// after (Link::Reshape), and returns when the last frame arrived and when the switch happened,
// since the first send.
struct ReshapeRun {
  absl::Duration switched, last;
};
ReshapeRun RunReshape(double from_gbps, double to_gbps, int frames) {
  FrameRecorder recorder, unused;
  auto transport = *CreateTransport({});
  auto listener = *transport->Listen("shaper-reshape:0");
  LinkShape shape;
  shape.gbps = from_gbps;
  auto sender = ShapeLink(*transport->Connect(listener->address(), absl::Seconds(1)), shape);
  auto receiver = *listener->Accept(absl::Seconds(1));
  receiver->Start(&recorder);
  sender->Start(&unused);
  const absl::Time start = absl::Now();
  for (int i = 0; i < frames; ++i) {
    EXPECT_TRUE(sender->Send(MakeFrame(FrameType::kChunk, 1, "", std::string(100000, 'd'))).ok());
  }
  shape.gbps = to_gbps;
  EXPECT_TRUE(sender->Reshape(shape).ok());
  ReshapeRun run;
  run.switched = absl::Now() - start;
  EXPECT_TRUE(recorder.WaitForFrames(frames, absl::Seconds(30)));
  run.last = absl::Now() - start;
  return run;
}

TEST(LinkShaperTest, ARateChangeReachesTheFramesAlreadyQueued) {
  // 500 KB queued at 2 MB/s (~220 ms of bucket), then the rate drops 10x: what the old rate had
  // not released by the switch (at most the 64 KiB burst plus the switch's time at 2 MB/s) goes
  // at 200 KB/s. Without the re-timing every frame would be through at ~220 ms.
  constexpr double kFast = 0.016, kSlow = 0.0016;  // Gbit/s
  constexpr int kFrames = 5;
  constexpr double kTotal = kFrames * 100000.0, kBurst = 64 * 1024.0;
  const ReshapeRun drop = RunReshape(kFast, kSlow, kFrames);
  // (A switch measured late only lowers this floor: it counts more bytes as gone at the old rate.)
  const double gone = kBurst + absl::ToDoubleSeconds(drop.switched) * kFast * 1e9 / 8;
  const double floor_s =
      absl::ToDoubleSeconds(drop.switched) + std::max(0.0, kTotal - gone) / (kSlow * 1e9 / 8);
  std::printf("drop: switched at %s, last frame at %s (floor %.3f s)\n",
              absl::FormatDuration(drop.switched).c_str(), absl::FormatDuration(drop.last).c_str(),
              floor_s);
  ASSERT_LT(drop.switched, absl::Milliseconds(150)) << "the sends took most of the old schedule";
  EXPECT_GE(absl::ToDoubleSeconds(drop.last), floor_s - 1e-3);
  EXPECT_GE(drop.last, absl::Seconds(1));  // never the old rate's ~220 ms
  // The whole transfer at the slow rate is the most it can take (plus wake-up slack).
  EXPECT_LE(drop.last, absl::Seconds(kTotal / (kSlow * 1e9 / 8)) + absl::Milliseconds(500));

  // The other way: queued at 200 KB/s (~2.2 s of bucket), then 10x faster: through in ~220 ms.
  const ReshapeRun rise = RunReshape(kSlow, kFast, kFrames);
  std::printf("rise: switched at %s, last frame at %s\n",
              absl::FormatDuration(rise.switched).c_str(), absl::FormatDuration(rise.last).c_str());
  EXPECT_LE(rise.last, absl::Milliseconds(1200));
}

// An inner link that records who handed it each frame, in order.
class RecordingLink : public Link {
 public:
  struct Sent {
    uint64_t session_id;
    std::thread::id thread;
  };
  void Start(LinkHandler*) override {}
  absl::Status Send(Frame frame) override {
    absl::MutexLock lock(&mu_);
    sent_.push_back({frame.session_id, std::this_thread::get_id()});
    return absl::OkStatus();
  }
  void Close() override {}
  std::string Describe() const override { return "recording"; }
  std::vector<Sent> AwaitSent(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return sent_.size() >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
    return sent_;
  }

 private:
  absl::Mutex mu_;
  std::vector<Sent> sent_ ABSL_GUARDED_BY(mu_);
};

Frame DataFrame(uint64_t session, size_t bytes) {
  Frame f;
  f.type = FrameType::kChunk;
  f.session_id = session;
  const std::string data(bytes, 'd');
  f.payload = Payload::Copy(data.data(), data.size());
  return f;
}

TEST(LinkShaperTest, AFrameDueAtOnceLeavesOnTheSendersThreadAndFramesKeepTheirOrder) {
  // Unshaped but reshapable (a sweep's link): every frame is due at once, none waits for the
  // shaper's thread (on a CPU busy computing, that hand-off waits for a scheduler slice).
  {
    auto inner = std::make_unique<RecordingLink>();
    RecordingLink* recorded = inner.get();
    LinkShape shape;
    shape.reshapable = true;
    auto link = ShapeLink(std::move(inner), shape);
    for (uint64_t i = 1; i <= 3; ++i) ASSERT_TRUE(link->Send(DataFrame(i, 1000)).ok());
    const std::vector<RecordingLink::Sent> sent = recorded->AwaitSent(3);
    ASSERT_EQ(sent.size(), 3u);
    for (uint64_t i = 0; i < 3; ++i) {
      EXPECT_EQ(sent[i].session_id, i + 1);
      EXPECT_EQ(sent[i].thread, std::this_thread::get_id());
    }
  }
  // Shaped at 8 Mbit/s (1 MB/s) with a 64 KiB burst: the first 60 KB frame fits the burst and
  // leaves at once, here; the next two wait for the bucket (~55 ms) and go on the shaper's thread,
  // in the order they were handed over.
  auto inner = std::make_unique<RecordingLink>();
  RecordingLink* recorded = inner.get();
  LinkShape shape;
  shape.gbps = 0.008;
  auto link = ShapeLink(std::move(inner), shape);
  ASSERT_TRUE(link->Send(DataFrame(1, 60000)).ok());
  ASSERT_TRUE(link->Send(DataFrame(2, 60000)).ok());
  ASSERT_TRUE(link->Send(DataFrame(3, 100)).ok());
  const std::vector<RecordingLink::Sent> sent = recorded->AwaitSent(3);
  ASSERT_EQ(sent.size(), 3u);
  EXPECT_EQ(sent[0].session_id, 1u);
  EXPECT_EQ(sent[0].thread, std::this_thread::get_id());
  EXPECT_EQ(sent[1].session_id, 2u);
  EXPECT_NE(sent[1].thread, std::this_thread::get_id());
  EXPECT_EQ(sent[2].session_id, 3u);  // due after 2: queued behind it, not sent past it
  EXPECT_NE(sent[2].thread, std::this_thread::get_id());
}

}  // namespace
}  // namespace scd::transport
