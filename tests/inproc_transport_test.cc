// What only the in-process backend has: payloads handed over without a copy, names as addresses,
// and the factory's errors. The Link contract every backend keeps: link_contract_test.
#include "transport/inproc/inproc_transport.h"

#include <gtest/gtest.h>

#include "tests/transport_test_util.h"

namespace scd::transport {
namespace {

using ::scd::testing::FrameRecorder;
using ::scd::testing::MakeFrame;

TEST(InProcessTransportTest, PayloadsAreHandedOverNotCopied) {
  FrameRecorder at_receiver;  // outlives the links
  auto transport = *CreateTransport({});
  EXPECT_EQ(transport->capabilities().backend, "inproc");
  EXPECT_TRUE(transport->capabilities().zero_copy_send);
  auto listener = *transport->Listen("inproc-test:0");
  auto sender = *transport->Connect(listener->address(), absl::Seconds(1));
  auto receiver = *listener->Accept(absl::Seconds(1));
  receiver->Start(&at_receiver);
  auto bytes = std::make_shared<std::string>(1 << 20, 'z');
  for (int i = 0; i < 10; ++i) {
    Frame frame = MakeFrame(FrameType::kChunk, i, std::to_string(i));
    frame.payload = Payload(reinterpret_cast<const uint8_t*>(bytes->data()), bytes->size(), bytes);
    ASSERT_TRUE(sender->Send(std::move(frame)).ok());
  }
  ASSERT_TRUE(at_receiver.WaitForFrames(10, absl::Seconds(2)));
  std::vector<Frame> frames = at_receiver.TakeFrames();
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(frames[i].meta, std::to_string(i));
    EXPECT_EQ(frames[i].payload.data(), reinterpret_cast<const uint8_t*>(bytes->data()));
  }
  frames.clear();
  EXPECT_EQ(bytes.use_count(), 1);  // every view released
  sender.reset();
  receiver.reset();
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
