// The in-process backend: frames in order, payloads handed over without a copy, link-down and
// listener semantics of transport/transport.h, and the factory's errors.
#include "transport/inproc_transport.h"

#include <gtest/gtest.h>

#include "tests/transport_test_util.h"

namespace scd::transport {
namespace {

using ::scd::testing::FrameRecorder;
using ::scd::testing::MakeFrame;

TEST(InProcessTransportTest, FramesArriveInOrderAndPayloadsAreNotCopied) {
  FrameRecorder at_receiver, at_sender;  // handlers outlive the links
  auto transport = *CreateTransport({});
  EXPECT_EQ(transport->capabilities().backend, "inproc");
  EXPECT_TRUE(transport->capabilities().zero_copy_send);
  auto listener = *transport->Listen("inproc-test:0");
  auto sender = *transport->Connect(listener->address(), absl::Seconds(1));
  auto receiver = *listener->Accept(absl::Seconds(1));
  receiver->Start(&at_receiver);
  sender->Start(&at_sender);
  auto bytes = std::make_shared<std::string>(1 << 20, 'z');
  for (int i = 0; i < 100; ++i) {
    Frame frame = MakeFrame(i % 3 == 0 ? FrameType::kCredit : FrameType::kChunk, i,
                            std::to_string(i));
    if (frame.type == FrameType::kChunk) {
      frame.payload = Payload(reinterpret_cast<const uint8_t*>(bytes->data()), bytes->size(), bytes);
    }
    ASSERT_TRUE(sender->Send(std::move(frame)).ok());
  }
  ASSERT_TRUE(receiver->Send(MakeFrame(FrameType::kAck, 7, "back")).ok());
  ASSERT_TRUE(at_receiver.WaitForFrames(100, absl::Seconds(2)));
  ASSERT_TRUE(at_sender.WaitForFrames(1, absl::Seconds(2)));
  std::vector<Frame> frames = at_receiver.TakeFrames();
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(frames[i].session_id, static_cast<uint64_t>(i));
    EXPECT_EQ(frames[i].meta, std::to_string(i));
    if (frames[i].type == FrameType::kChunk) {
      EXPECT_EQ(frames[i].payload.data(), reinterpret_cast<const uint8_t*>(bytes->data()));
    }
  }
  frames.clear();
  EXPECT_EQ(bytes.use_count(), 1);
  EXPECT_EQ(at_sender.TakeFrames()[0].meta, "back");
}

TEST(InProcessTransportTest, CloseReachesThePeerOnceAndReleasesQueuedFrames) {
  FrameRecorder at_receiver, at_sender;
  auto transport = *CreateTransport({});
  auto listener = *transport->Listen("inproc-close:0");
  auto sender = *transport->Connect(listener->address(), absl::Seconds(1));
  auto receiver = *listener->Accept(absl::Seconds(1));
  // Queued before the receiver starts: held, then released by the close.
  ASSERT_TRUE(sender->Send(MakeFrame(FrameType::kChunk, 1, "", "queued")).ok());
  EXPECT_EQ(LiveTransportBuffers(), 1);
  sender->Start(&at_sender);
  sender->Close();
  EXPECT_EQ(LiveTransportBuffers(), 0);
  receiver->Start(&at_receiver);
  auto down = at_receiver.WaitForLinkDown(absl::Seconds(1));
  ASSERT_TRUE(down.has_value());
  EXPECT_TRUE(absl::IsUnavailable(*down)) << *down;
  auto mine = at_sender.WaitForLinkDown(absl::Seconds(1));
  ASSERT_TRUE(mine.has_value());
  EXPECT_TRUE(absl::IsCancelled(*mine)) << *mine;
  EXPECT_TRUE(absl::IsFailedPrecondition(sender->Send(MakeFrame(FrameType::kAck, 1, ""))));
  sender.reset();
  receiver.reset();
  EXPECT_EQ(at_receiver.link_down_calls(), 1);
  EXPECT_EQ(at_sender.link_down_calls(), 1);
}

TEST(InProcessTransportTest, ListenerAndFactoryErrors) {
  auto transport = *CreateTransport({});
  EXPECT_TRUE(absl::IsUnavailable(transport->Connect("nobody", absl::Seconds(1)).status()));
  auto listener = *transport->Listen("taken");
  EXPECT_TRUE(absl::IsAlreadyExists(transport->Listen("taken").status()));
  EXPECT_TRUE(absl::IsDeadlineExceeded(listener->Accept(absl::Milliseconds(10)).status()));
  listener->Close();
  EXPECT_TRUE(absl::IsCancelled(listener->Accept(absl::Milliseconds(10)).status()));
  EXPECT_TRUE(absl::IsUnavailable(transport->Connect("taken", absl::Seconds(1)).status()));
  TransportOptions options;
  options.backend = "carrier-pigeon";
  auto bad = CreateTransport(options);
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
  EXPECT_NE(bad.status().message().find("inproc"), std::string::npos) << bad.status();
}

}  // namespace
}  // namespace scd::transport
