// The link shaper: measured goodput of 64 MiB through a shaped in-process link is within 5 % of
// the setting at 0.1, 1 and 10 Gbit/s; latency delays every frame by the setting; control frames
// overtake queued data frames.
#include "transport/link_shaper.h"

#include <gtest/gtest.h>

#include <thread>

#include "tests/transport_test_util.h"
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
  auto connection =
      TransferConnection::Create(*transport->Connect(acceptor.address(), absl::Seconds(1)),
                                 options);
  auto session = *connection->StartSession(v1::TransferHeader(), absl::Seconds(60));
  const std::string block(1 << 20, 'x');
  std::thread sender([&] {
    for (size_t sent = 0; sent < total; sent += block.size()) {
      EXPECT_TRUE(session->SendChunk(v1::CodeChunk(), Payload(reinterpret_cast<const uint8_t*>(
                                                                  block.data()),
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

TEST(LinkShaperTest, GoodputOf64MiBIsWithinFivePercentOfTheSetting) {
  for (double gbps : {0.1, 1.0, 10.0}) {
    const double measured = MeasuredGoodput(gbps, size_t{64} << 20);
    std::printf("shaped %.1f Gbit/s: measured %.4f Gbit/s (%.2f %%)\n", gbps, measured,
                100.0 * (measured / gbps - 1));
    EXPECT_NEAR(measured, gbps, 0.05 * gbps);
  }
}

TEST(LinkShaperTest, LatencyDelaysEveryFrameAndControlOvertakesData) {
  auto transport = *CreateTransport({});
  auto listener = *transport->Listen("shaper-latency:0");
  LinkShape shape;
  shape.gbps = 0.08;  // 10 MB/s: 10 x 100 KB data frames take ~100 ms
  shape.latency = absl::Milliseconds(30);
  auto sender = ShapeLink(*transport->Connect(listener->address(), absl::Seconds(1)), shape);
  auto receiver = *listener->Accept(absl::Seconds(1));
  FrameRecorder recorder;
  receiver->Start(&recorder);
  FrameRecorder unused;
  sender->Start(&unused);
  const absl::Time start = absl::Now();
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(sender->Send(MakeFrame(FrameType::kChunk, 1, "", std::string(100000, 'd'))).ok());
  }
  ASSERT_TRUE(sender->Send(MakeFrame(FrameType::kCredit, 1, "control")).ok());
  ASSERT_TRUE(recorder.WaitForFrames(1, absl::Seconds(2)));
  const absl::Duration first = absl::Now() - start;
  std::vector<Frame> frames = recorder.TakeFrames();
  // The control frame arrives after the latency, long before the queued data.
  EXPECT_EQ(frames.front().type, FrameType::kCredit) << FrameTypeName(frames.front().type);
  EXPECT_GE(first, absl::Milliseconds(29));
  EXPECT_LE(first, absl::Milliseconds(80));
  ASSERT_TRUE(recorder.WaitForFrames(10 - (frames.size() - 1), absl::Seconds(2)));
  const absl::Duration all = absl::Now() - start;
  // 1 MB at 10 MB/s = 100 ms, less the 64 KiB burst (~6.5 ms), plus 30 ms latency.
  EXPECT_GE(all, absl::Milliseconds(115));
  EXPECT_LE(all, absl::Milliseconds(200));
}

}  // namespace
}  // namespace scd::transport
