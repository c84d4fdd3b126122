// DeliveryGate: frames before Start are held and delivered in order; one OnLinkDown and no frame
// after it; a local close drops what was held, a peer's close delivers it first; a handler that
// closes its own link hears the end after its call returns; exceptions stay inside.
#include "transport/delivery_gate.h"

#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tests/transport_test_util.h"

namespace scd::transport {
namespace {

using ::scd::testing::FrameRecorder;
using ::scd::testing::MakeFrame;

std::vector<std::string> Metas(FrameRecorder& got) {
  std::vector<std::string> out;
  for (const Frame& frame : got.TakeFrames()) out.push_back(frame.meta);
  return out;
}

TEST(DeliveryGateTest, HoldsUntilStartThenDeliversInOrder) {
  DeliveryGate gate("test");
  gate.Deliver(MakeFrame(FrameType::kChunk, 1, "a"));
  gate.Deliver(MakeFrame(FrameType::kChunk, 1, "b"));
  EXPECT_FALSE(gate.started());
  FrameRecorder got;
  gate.Start(&got);
  gate.Deliver(MakeFrame(FrameType::kChunk, 1, "c"));
  EXPECT_EQ(Metas(got), (std::vector<std::string>{"a", "b", "c"}));
  FrameRecorder other;
  gate.Start(&other);  // a second Start is ignored
  gate.Deliver(MakeFrame(FrameType::kChunk, 1, "d"));
  EXPECT_EQ(Metas(got), (std::vector<std::string>{"d"}));
  EXPECT_EQ(other.frame_count(), 0u);
}

TEST(DeliveryGateTest, OneLinkDownAndNothingAfterIt) {
  DeliveryGate gate("test");
  FrameRecorder got;
  gate.Start(&got);
  gate.Down(absl::UnavailableError("peer closed the link"), false);
  gate.Down(absl::CancelledError("again"), true);
  gate.Deliver(MakeFrame(FrameType::kChunk, 1, "late"));
  EXPECT_EQ(got.link_down_calls(), 1);
  EXPECT_TRUE(absl::IsUnavailable(*got.WaitForLinkDown(absl::ZeroDuration())));
  EXPECT_EQ(got.frame_count(), 0u);
  EXPECT_TRUE(gate.down());
}

TEST(DeliveryGateTest, APeersCloseDeliversWhatCameBeforeALocalCloseDropsIt) {
  {
    DeliveryGate gate("peer");
    gate.Deliver(MakeFrame(FrameType::kAck, 1, "before"));
    gate.Down(absl::UnavailableError("peer closed the link"), /*drop_held=*/false);
    FrameRecorder got;
    gate.Start(&got);
    EXPECT_EQ(Metas(got), (std::vector<std::string>{"before"}));
    EXPECT_EQ(got.link_down_calls(), 1);
  }
  {
    DeliveryGate gate("local");
    gate.Deliver(MakeFrame(FrameType::kAck, 1, "before"));
    gate.Down(absl::CancelledError("link closed"), /*drop_held=*/true);
    FrameRecorder got;
    gate.Start(&got);
    EXPECT_EQ(got.frame_count(), 0u);
    EXPECT_EQ(got.link_down_calls(), 1);
  }
  {
    // The peer closed, then a Close here before Start: what was held goes (buffers released),
    // and the handler hears the peer's reason.
    DeliveryGate gate("peer then local");
    auto owner = std::make_shared<int>(0);
    Frame held = MakeFrame(FrameType::kChunk, 1, "held");
    held.payload = Payload(reinterpret_cast<const uint8_t*>(owner.get()), sizeof(int), owner);
    gate.Deliver(std::move(held));
    gate.Down(absl::UnavailableError("peer closed the link"), /*drop_held=*/false);
    gate.Down(absl::CancelledError("link closed"), /*drop_held=*/true);
    EXPECT_EQ(owner.use_count(), 1) << "the held frame's payload is still referenced";
    FrameRecorder got;
    gate.Start(&got);
    EXPECT_EQ(got.frame_count(), 0u);
    EXPECT_EQ(got.link_down_calls(), 1);
    EXPECT_TRUE(absl::IsUnavailable(*got.WaitForLinkDown(absl::ZeroDuration())));
  }
}

// Closes "its link" (the gate) from inside OnFrame and checks OnLinkDown is not re-entered.
class ClosesInside : public LinkHandler {
 public:
  explicit ClosesInside(DeliveryGate* gate) : gate_(gate) {}
  void OnFrame(Frame) override {
    EXPECT_TRUE(gate_->InHandler());
    gate_->Down(absl::CancelledError("closed by the handler"), true);
    EXPECT_EQ(downs_, 0) << "OnLinkDown re-entered the handler";
    ++frames_;
  }
  void OnLinkDown(absl::Status status) override {
    EXPECT_TRUE(absl::IsCancelled(status));
    ++downs_;
  }
  int frames_ = 0, downs_ = 0;

 private:
  DeliveryGate* gate_;
};

TEST(DeliveryGateTest, AHandlerClosingItsOwnLinkHearsTheEndAfterItsCall) {
  DeliveryGate gate("test");
  ClosesInside handler(&gate);
  gate.Start(&handler);
  gate.Deliver(MakeFrame(FrameType::kChunk, 1, "a"));
  gate.Deliver(MakeFrame(FrameType::kChunk, 1, "b"));
  EXPECT_EQ(handler.frames_, 1);
  EXPECT_EQ(handler.downs_, 1);
  EXPECT_FALSE(gate.InHandler());
}

class Throws : public LinkHandler {
 public:
  void OnFrame(Frame) override { throw std::runtime_error("handler bug"); }
  void OnLinkDown(absl::Status) override { throw 42; }
};

TEST(DeliveryGateTest, NothingAHandlerThrowsEscapes) {
  DeliveryGate gate("test");
  Throws handler;
  gate.Start(&handler);
  gate.Deliver(MakeFrame(FrameType::kChunk, 1, "a"));
  gate.Down(absl::UnavailableError("x"), false);
  EXPECT_TRUE(gate.down());
}

TEST(DeliveryGateTest, CallsFromManyThreadsAreSerialized) {
  DeliveryGate gate("test");
  FrameRecorder got;
  gate.Start(&got);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&gate, t] {
      for (int i = 0; i < 500; ++i) gate.Deliver(MakeFrame(FrameType::kCredit, t, "x"));
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(got.frame_count(), 2000u);
}

}  // namespace
}  // namespace scd::transport
