// LaneQueue: control frames leave before queued data, data keeps its order, DropSession drops
// only the session's data (except what `keep` protects) and tells the kept frames behind it how
// many bytes went ahead of them.
#include "transport/lane_queue.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/transport_test_util.h"

namespace scd::transport {
namespace {

using ::scd::testing::MakeFrame;

Frame Data(uint64_t session, const std::string& meta, size_t bytes = 0) {
  return MakeFrame(FrameType::kChunk, session, meta, std::string(bytes, 'x'));
}
Frame Control(uint64_t session, const std::string& meta) {
  return MakeFrame(FrameType::kCredit, session, meta);
}

std::vector<std::string> Drain(LaneQueue<Frame>& queue) {
  std::vector<std::string> out;
  while (auto frame = queue.Pop()) out.push_back(frame->meta);
  return out;
}

TEST(LaneQueueTest, ControlLeavesFirstDataKeepsItsOrder) {
  LaneQueue<Frame> queue;
  EXPECT_TRUE(queue.empty());
  EXPECT_EQ(queue.Next(), nullptr);
  queue.Push(Data(1, "d1"));
  queue.Push(Data(1, "d2"));
  queue.Push(Control(1, "c1"));
  queue.Push(Data(2, "d3"));
  queue.Push(Control(2, "c2"));
  EXPECT_EQ(queue.size(), 5u);
  EXPECT_EQ(queue.Next()->meta, "c1");
  EXPECT_EQ(Drain(queue), (std::vector<std::string>{"c1", "c2", "d1", "d2", "d3"}));
  EXPECT_FALSE(queue.Pop().has_value());
}

TEST(LaneQueueTest, DropSessionDropsOnlyThatSessionsDataAndReleasesIt) {
  LaneQueue<Frame> queue;
  queue.Push(MakeFrame(FrameType::kHeader, 1, "h"));  // the peer still learns of the session
  queue.Push(Data(1, "a", 100));
  queue.Push(Data(2, "b", 10));
  queue.Push(Control(1, "c"));
  queue.Push(Data(1, "d", 200));
  queue.Push(Data(2, "e", 20));
  std::deque<Frame> dropped = queue.DropSession(1);
  ASSERT_EQ(dropped.size(), 2u);
  EXPECT_EQ(dropped[0].meta, "a");
  EXPECT_EQ(dropped[1].meta, "d");
  EXPECT_EQ(Drain(queue), (std::vector<std::string>{"c", "h", "b", "e"}));
  const int64_t live = LiveTransportBuffers();
  dropped.clear();
  EXPECT_EQ(LiveTransportBuffers(), live - 2);
}

// Issue 14's cancel storm: dropping a session with nothing queued must leave every frame intact.
TEST(LaneQueueTest, DroppingAnAbsentSessionLeavesEveryFrameIntact) {
  LaneQueue<Frame> queue;
  queue.Push(Data(1, "a", 5));
  queue.Push(Data(2, "b", 7));
  EXPECT_TRUE(queue.DropSession(3).empty());
  ASSERT_EQ(queue.data().size(), 2u);
  EXPECT_EQ(queue.data()[0].meta, "a");
  EXPECT_EQ(queue.data()[0].payload.size(), 5u);
  EXPECT_EQ(queue.data()[1].meta, "b");
  EXPECT_EQ(queue.data()[1].payload.size(), 7u);
}

struct Timed {
  int at = 0;
  Frame frame;
};

TEST(LaneQueueTest, KeptFramesLearnTheBytesDroppedAheadAndKeepIsHonoured) {
  LaneQueue<Timed> queue;
  queue.Push({0, Data(7, "started", 50)});  // e.g. a chunk half written: kept
  queue.Push({1, Data(1, "x", 10)});
  queue.Push({2, Data(7, "dropped", 30)});
  queue.Push({3, Data(1, "y", 10)});
  std::vector<std::pair<std::string, size_t>> kept;
  std::deque<Timed> dropped = queue.DropSession(
      7, [](const Timed& t) { return t.frame.meta == "started"; },
      [&](Timed& t, size_t bytes) { kept.emplace_back(t.frame.meta, bytes); });
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0].frame.meta, "dropped");
  // "x" precedes the dropped frame; only "y" is told (meta "dropped" + 30 payload bytes ahead).
  EXPECT_EQ(kept, (std::vector<std::pair<std::string, size_t>>{{"y", 7 + 30}}));
  ASSERT_EQ(queue.data().size(), 3u);
  EXPECT_EQ(queue.data()[0].frame.meta, "started");
}

TEST(LaneQueueTest, TakeAllEmptiesBothLanesControlFirst) {
  LaneQueue<Frame> queue;
  queue.Push(Data(1, "d"));
  queue.Push(Control(1, "c"));
  std::deque<Frame> all = queue.TakeAll();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].meta, "c");
  EXPECT_EQ(all[1].meta, "d");
  EXPECT_TRUE(queue.empty());
}

}  // namespace
}  // namespace scd::transport
