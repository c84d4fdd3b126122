// The fault-injecting wrapper does what its policy says, and nothing else.
#include "transport/fault_injection.h"

#include <gtest/gtest.h>

#include "base/change_notice.h"
#include "tests/transport_test_util.h"

namespace scd::transport {
namespace {

using ::scd::testing::FrameRecorder;
using ::scd::testing::MakeFrame;

struct Pair {
  FrameRecorder sent_back, received;  // first: the handlers outlive the links
  std::unique_ptr<Transport> transport;
  std::unique_ptr<FaultInjectingLink> sender;
  std::unique_ptr<Link> receiver;
};

void Open(Pair& pair, FaultPolicy policy) {
  pair.transport = *CreateTransport({});
  auto listener = *pair.transport->Listen("faults:0");
  pair.sender = std::make_unique<FaultInjectingLink>(
      *pair.transport->Connect(listener->address(), absl::Seconds(1)), std::move(policy));
  pair.receiver = *listener->Accept(absl::Seconds(1));
  pair.receiver->Start(&pair.received);
  pair.sender->Start(&pair.sent_back);
}

FaultRule Rule(FaultAction action, int64_t nth, std::optional<FrameType> type = std::nullopt) {
  FaultRule rule;
  rule.action = action;
  rule.nth = nth;
  rule.type = type;
  return rule;
}

TEST(FaultInjectionTest, DropsTheNthMatchingFrameOnly) {
  Pair pair;
  Open(pair, {{Rule(FaultAction::kDrop, 1, FrameType::kChunk)}});
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(pair.sender->Send(MakeFrame(FrameType::kChunk, i, "", "x")).ok());
    ASSERT_TRUE(pair.sender->Send(MakeFrame(FrameType::kCredit, i, "")).ok());
  }
  ASSERT_TRUE(pair.received.WaitForFrames(7, absl::Seconds(1)));
  std::vector<uint64_t> chunks;
  for (const Frame& f : pair.received.TakeFrames()) {
    if (f.type == FrameType::kChunk) chunks.push_back(f.session_id);
  }
  EXPECT_EQ(chunks, (std::vector<uint64_t>{0, 2, 3}));
  EXPECT_EQ(pair.sender->counters().dropped, 1);
}

TEST(FaultInjectionTest, CorruptsACopyNotTheSendersBytes) {
  Pair pair;
  FaultRule rule = Rule(FaultAction::kCorrupt, 0);
  rule.corrupt_offset = 2;
  Open(pair, {{rule}});
  auto bytes = std::make_shared<std::string>("abcdef");
  Frame frame;
  frame.type = FrameType::kChunk;
  frame.payload = Payload(reinterpret_cast<const uint8_t*>(bytes->data()), bytes->size(), bytes);
  ASSERT_TRUE(pair.sender->Send(std::move(frame)).ok());
  ASSERT_TRUE(pair.received.WaitForFrames(1, absl::Seconds(1)));
  const std::string arrived(pair.received.TakeFrames()[0].payload.view());
  EXPECT_EQ(*bytes, "abcdef");
  EXPECT_EQ(arrived.size(), 6u);
  EXPECT_NE(arrived, "abcdef");
  EXPECT_EQ(arrived.substr(0, 2) + arrived.substr(3), "abdef");
}

// A corruption after the backend (incoming) voids the checksum the backend took as the bytes
// landed (Frame::payload_crc), so the session computes it again and sees the damage.
TEST(FaultInjectionTest, IncomingCorruptionClearsTheBackendsChecksum) {
  Pair pair;
  FaultRule rule = Rule(FaultAction::kCorrupt, 0, FrameType::kChunk);
  rule.direction = FaultDirection::kIncoming;
  Open(pair, {{rule}});
  Frame frame = MakeFrame(FrameType::kChunk, 1, "", "abcdef");
  frame.payload_crc = 0x1234u;  // as a receiving backend would have set it
  ASSERT_TRUE(pair.receiver->Send(std::move(frame)).ok());
  ASSERT_TRUE(pair.sent_back.WaitForFrames(1, absl::Seconds(1)));
  const Frame arrived = pair.sent_back.TakeFrames()[0];
  EXPECT_NE(arrived.payload.view(), "abcdef");
  EXPECT_FALSE(arrived.payload_crc.has_value());
}

TEST(FaultInjectionTest, DelayHoldsTheFrame) {
  Pair pair;
  FaultRule rule = Rule(FaultAction::kDelay, 0);
  rule.delay = absl::Milliseconds(150);
  Open(pair, {{rule}});
  const absl::Time start = absl::Now();
  ASSERT_TRUE(pair.sender->Send(MakeFrame(FrameType::kChunk, 1, "")).ok());
  ASSERT_TRUE(pair.received.WaitForFrames(1, absl::Seconds(2)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(145));
}

TEST(FaultInjectionTest, DisconnectClosesTheLinkForBothSides) {
  Pair pair;
  Open(pair, {{Rule(FaultAction::kDisconnect, 2)}});
  for (int i = 0; i < 3; ++i) pair.sender->Send(MakeFrame(FrameType::kChunk, i, "")).IgnoreError();
  auto down = pair.received.WaitForLinkDown(absl::Seconds(1));
  ASSERT_TRUE(down.has_value());
  EXPECT_TRUE(absl::IsUnavailable(*down)) << *down;
  EXPECT_LE(pair.received.frame_count(), 2u);  // frames still queued at the close are lost
  EXPECT_TRUE(pair.sent_back.WaitForLinkDown(absl::Seconds(1)).has_value());
}

TEST(FaultInjectionTest, FreezeSilencesBothDirectionsButKeepsTheLinkUp) {
  Pair pair;
  Open(pair, {{Rule(FaultAction::kFreeze, 1)}});
  for (int i = 0; i < 3; ++i)
    ASSERT_TRUE(pair.sender->Send(MakeFrame(FrameType::kChunk, i, "")).ok());
  ASSERT_TRUE(pair.receiver->Send(MakeFrame(FrameType::kCredit, 9, "")).ok());
  // Chunks 1 and 2 and the credit are swallowed: each one's buffer is let go as it is, a change
  // to wait on (base/change_notice.h); chunk 0 went through before the freeze.
  ASSERT_TRUE(AwaitChange([&] { return pair.sender->counters().frozen_frames == 3; },
                          absl::Now() + absl::Seconds(5)))
      << pair.sender->counters().frozen_frames;
  ASSERT_TRUE(pair.received.WaitForFrames(1, absl::Seconds(1)));
  EXPECT_EQ(pair.received.frame_count(), 1u);
  EXPECT_EQ(pair.sent_back.frame_count(), 0u);
  EXPECT_FALSE(pair.received.WaitForLinkDown(absl::ZeroDuration()).has_value());
  pair.sender->SetFrozen(false);
  ASSERT_TRUE(pair.sender->Send(MakeFrame(FrameType::kChunk, 5, "")).ok());
  EXPECT_TRUE(pair.received.WaitForFrames(2, absl::Seconds(1)));
}

}  // namespace
}  // namespace scd::transport
