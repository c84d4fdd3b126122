// AdaptiveSender: the in-flight window against its formula, and a layer handed over in pieces of
// positions over a real (in-process, shaped) transport -- consecutive, covering every position,
// each piece's codes the rows of the layer's, the first at the plan's rank and, once the drain
// shows the link cannot meet the budget, lower; raw payloads whole with the first piece. A consumer
// that takes nothing for a while (busy rebuilding) neither holds the link nor lowers the ranks:
// the window counts what this side still holds, over gRPC as in a deployment.
#include "producer/adaptive_sender.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <thread>

#include "base/simulated_clock.h"
#include "codec/chunk_rows.h"
#include "proto/code_chunk_framing.h"
#include "tests/test_util.h"
#include "tests/transport_test_util.h"

namespace scd::producer {
namespace {

TEST(AdaptiveSenderTest, TheWindowIsTwentyMillisecondsOfGoodputWithinItsBounds) {
  EXPECT_EQ(AdaptiveSender::Window(0), size_t{1} << 20);            // nothing known
  EXPECT_EQ(AdaptiveSender::Window(1.25e6), size_t{32} << 10);      // 25 kB: the floor
  EXPECT_EQ(AdaptiveSender::Window(1.25e9), size_t{25000000});      // 10 Gbit/s: 25 MB
  EXPECT_EQ(AdaptiveSender::Window(1e12), size_t{64} << 20);        // the cap
  EXPECT_EQ(AdaptiveSender::Window(1.25e9, 4096), size_t{4096});    // a caller's cap
}

// The gauge's wait holds no thread: told at once when the bytes are within the bound, else by the
// release that brings them there (not an earlier one), or by Stop.
TEST(AdaptiveSenderTest, TheGaugeTellsAWaiterWhenItsBytesDrainOrItStops) {
  ByteGauge gauge;
  int told = 0;
  gauge.OnAtMost(0, [&told] { ++told; });
  EXPECT_EQ(told, 1);  // nothing held
  gauge.Add(1000);
  gauge.OnAtMost(300, [&told] { ++told; });
  gauge.Release(600);  // 400 held: still above
  EXPECT_EQ(told, 1);
  gauge.Release(100);  // 300
  EXPECT_EQ(told, 2);
  gauge.Release(100);  // told once only
  EXPECT_EQ(told, 2);
  gauge.OnAtMost(0, [&told] { ++told; });
  gauge.Stop();
  EXPECT_EQ(told, 3);
  EXPECT_EQ(gauge.bytes(), 200u);
}

AdaptiveSender::Options Adapt(AdaptBudget budget, std::vector<LayerBytes> planned, absl::Time start,
                              size_t max_window, Clock* clock = nullptr) {
  AdaptiveSender::Options options;
  options.budget = budget;
  options.planned = std::move(planned);
  options.start = start;
  options.max_window = max_window;
  options.clock = clock;
  return options;
}

CodeChunk Chunk(PayloadKind kind, const at::Tensor& values) {
  CodeChunk chunk = PackTensor(values, WireDtype::kF16);
  chunk.layer = 0;
  chunk.kind = kind;
  chunk.token_begin = 0;
  chunk.token_end = values.size(-2);
  return chunk;
}

// An adaptive session over `backend` whose link is shaped at `gbps` (no burst), and a thread
// that takes every chunk into `received` after `busy` (a consumer busy before its first take).
struct AdaptivePeers {
  testing::SessionPeers peers;
  std::shared_ptr<transport::SendSession> session;
  std::thread receiver;
};
AdaptivePeers StartAdaptive(const std::string& backend, double gbps, absl::Duration busy,
                            std::vector<CodeChunk>* received) {
  transport::ConnectionOptions shaped;
  shaped.shape.gbps = gbps;
  shaped.shape.burst_bytes = 1;
  AdaptivePeers p;
  p.peers = testing::ConnectSessions(backend, {}, shaped);
  v1::TransferHeader header;
  header.set_request_id("adaptive");
  header.set_adaptive(true);
  p.session = testing::Ok(p.peers.sender->StartSession(header, absl::Seconds(30)));
  p.receiver = std::thread([acceptor = p.peers.acceptor.get(), busy, received] {
    auto incoming = acceptor->Accept(absl::Seconds(10));
    ASSERT_TRUE(incoming.ok()) << incoming.status();
    // paces: the receiver is busy this long before it reads (the scenario)
    absl::SleepFor(busy);
    for (;;) {
      auto next = (*incoming)->Next(absl::Seconds(30));
      ASSERT_TRUE(next.ok()) << next.status();
      if (!next->has_value()) break;
      received->push_back(testing::Ok(UnframeChunk((**next).meta, (**next).payload.view(), 64)));
    }
  });
  return p;
}

TEST(AdaptiveSenderTest, ALayerGoesInPiecesLoweredOnceTheLinkShowsItIsBehind) {
  // One layer: a key code [2, 64, 8] and a raw value [2, 64, 4] (f16: 32 + 16 bytes a position).
  at::manual_seed(5);
  const at::Tensor key = at::randn({2, 64, 8});
  const at::Tensor value = at::randn({2, 64, 4});
  std::vector<CodeChunk> layer = {Chunk(PayloadKind::kKeyCode, key),
                                  Chunk(PayloadKind::kRawValue, value)};
  // 1.56 kB/s against a plan of 10 MB/s and a budget of 1 s: the 3 kB fit the plan (in 0.3 ms)
  // with a second to spare, so the first piece goes at the plan's rank even when this test's
  // threads are held up for most of that second (a loaded CI machine held one up for 100 ms
  // when the budget was 100 ms and the plan 100 kB/s, leaving 31 ms of slack: that first piece
  // went lowered); the link needs ~2 s, so once the first drain is measured (~0.7 s) every
  // later piece is cut down, however late.
  std::vector<CodeChunk> received;
  AdaptivePeers p = StartAdaptive("inproc", 1.25e-5, absl::ZeroDuration(), &received);
  auto& session = p.session;
  auto& receiver = p.receiver;
  AdaptiveSender sender(
      session, Adapt({absl::Seconds(1), 1e7}, {{2 * 64 * 8 * 2, 2 * 64 * 4 * 2}}, absl::Now(),
                     /*max_window=*/512));
  ASSERT_TRUE(sender.Push(0, std::move(layer)).ok());
  ASSERT_TRUE(sender.Finish().ok());
  ASSERT_TRUE(session->Finish().ok());
  receiver.join();

  ASSERT_GE(received.size(), 3u);
  EXPECT_EQ(received[0].kind, PayloadKind::kRawValue);  // whole, with the first piece
  EXPECT_EQ(received[0].token_end - received[0].token_begin, 64);
  int64_t due = 0;
  bool full_first = false, lowered_later = false;
  const at::Tensor key_f16 = key.to(at::kHalf).to(at::kFloat);
  for (size_t i = 1; i < received.size(); ++i) {
    const CodeChunk& piece = received[i];
    ASSERT_EQ(piece.kind, PayloadKind::kKeyCode);
    EXPECT_EQ(piece.token_begin, due) << "piece " << i;
    due = piece.token_end;
    const int64_t rank = piece.shape.back();
    // The piece is the layer's rows at its first `rank` columns.
    const at::Tensor want =
        key_f16.narrow(1, piece.token_begin, piece.token_end - piece.token_begin)
            .narrow(-1, 0, rank);
    EXPECT_TRUE(at::equal(testing::Ok(UnpackTensor(piece, at::kCPU)), want)) << "piece " << i;
    if (i == 1) full_first = rank == 8;
    if (i > 1 && rank < 8) lowered_later = true;
  }
  EXPECT_EQ(due, 64);
  EXPECT_TRUE(full_first);  // nothing measured yet: the plan's rank
  EXPECT_TRUE(lowered_later);
  EXPECT_EQ(sender.report().lowered, std::vector<int>{0});
  EXPECT_EQ(sender.report().chunks, static_cast<int64_t>(received.size()));
}

TEST(AdaptiveSenderTest, AConsumerBusyBetweenTakesNeitherHoldsTheLinkNorLowersTheRanks) {
  at::manual_seed(6);
  const at::Tensor key = at::randn({2, 64, 8});
  const at::Tensor value = at::randn({2, 64, 4});
  std::vector<CodeChunk> layer = {Chunk(PayloadKind::kKeyCode, key),
                                  Chunk(PayloadKind::kRawValue, value)};
  // 100 kB/s, as planned: the 3 kB cross in ~30 ms, well within the 2 s budget; the consumer
  // takes its first chunk only after 3 s. Counting what the consumer has not taken, the sender
  // would wait for it with a 512-byte window, overrun the budget, and lower the ranks. (Seconds,
  // not the milliseconds the link needs: a loaded machine holds a thread up for hundreds.)
  std::vector<CodeChunk> received;
  AdaptivePeers p = StartAdaptive("grpc", 8e-4, absl::Seconds(3), &received);
  auto& session = p.session;
  auto& receiver = p.receiver;
  const absl::Time start = absl::Now();
  AdaptiveSender sender(session,
                        Adapt({absl::Seconds(2), 1e5}, {{2 * 64 * 8 * 2, 2 * 64 * 4 * 2}}, start,
                              /*max_window=*/512));
  ASSERT_TRUE(sender.Push(0, std::move(layer)).ok());
  ASSERT_TRUE(sender.Finish().ok());
  // Every piece handed over long before the consumer woke.
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(2500));
  ASSERT_TRUE(session->Finish().ok());
  receiver.join();
  EXPECT_TRUE(sender.report().lowered.empty());
  ASSERT_GE(received.size(), 3u);  // in pieces: the window held each one back until the last left
  int64_t due = 0;
  for (size_t i = 1; i < received.size(); ++i) {
    EXPECT_EQ(received[i].shape.back(), 8) << "piece " << i;
    EXPECT_EQ(received[i].token_begin, due) << "piece " << i;
    due = received[i].token_end;
  }
  EXPECT_EQ(due, 64);
}

// The sender's policy on a simulated clock, the test being the link: over the in-process backend
// the receiver holds the payload itself, so what this side holds drains exactly when the test
// drops a received chunk, and time moves only when the test moves it. One layer: a key code
// [2, 64, 8] (32 bytes a position, 2,048 in all) and a raw value [2, 64, 4] (1,024 bytes, whole
// with the first piece); a budget of 1 s at a planned 10 kB/s; a 300-byte window cap: pieces of
// 150 / 32 = 4 positions. By the governor's formula (codec/rank_governor.h):
//   piece 1, nothing measured: 3,072 bytes at 10 kB/s fit the second: the plan's rank 8;
//   the sender then waits (1,152 bytes held > 300) -- 0.5 s later the test drops the raw value:
//   1,024 bytes drained in 0.5 s, 2,048 B/s; 0.5 s left buys 1,024 bytes, 128 still held, the
//   key's 60 positions left are 1,920 bytes at rank 8: scale 896 / 1,920, rank floor(3.73) = 3.
TEST(AdaptiveSenderTest, OnASimulatedClockEachPieceWaitsForTheDrainAndTakesTheRankTheBudgetAllows) {
  SimulatedClock clock;
  testing::SessionPeers peers = testing::ConnectSessions("inproc");
  v1::TransferHeader header;
  header.set_request_id("adaptive-simulated");
  header.set_adaptive(true);
  auto session = testing::Ok(peers.sender->StartSession(header, absl::Seconds(30)));
  auto incoming = testing::Ok(peers.acceptor->Accept(absl::Seconds(10)));
  at::manual_seed(7);
  const at::Tensor key = at::randn({2, 64, 8});
  const at::Tensor value = at::randn({2, 64, 4});
  AdaptiveSender sender(session, Adapt({absl::Seconds(1), 1e4}, {{2048, 1024}}, clock.Now(),
                                       /*max_window=*/300, &clock));
  ASSERT_TRUE(
      sender.Push(0, {Chunk(PayloadKind::kKeyCode, key), Chunk(PayloadKind::kRawValue, value)})
          .ok());
  // Waits for the next chunk (an event: the sender's step hands it over), unframed.
  auto next = [&](transport::ReceivedChunk* raw) {
    auto got = incoming->Next(absl::Seconds(30));
    EXPECT_TRUE(got.ok() && got->has_value()) << got.status();
    *raw = std::move(**got);
    return testing::Ok(UnframeChunk(raw->meta, raw->payload.view(), 64));
  };
  transport::ReceivedChunk raw_value, first, second;
  const CodeChunk whole = next(&raw_value);
  EXPECT_EQ(whole.kind, PayloadKind::kRawValue);
  const CodeChunk piece1 = next(&first);
  EXPECT_EQ(piece1.token_begin, 0);
  EXPECT_EQ(piece1.token_end, 4);
  EXPECT_EQ(piece1.shape.back(), 8);

  clock.Advance(absl::Milliseconds(500));
  raw_value.payload.Reset();  // the link took the raw value: the sender's wait ends
  const CodeChunk piece2 = next(&second);
  EXPECT_EQ(piece2.token_begin, 4);
  EXPECT_EQ(piece2.token_end, 8);
  EXPECT_EQ(piece2.shape.back(), 3) << "not the rank the budget allows after the drain";

  // The rest, each dropped as it comes (the clock standing still): every position, in order.
  first.payload.Reset();
  second.payload.Reset();
  int64_t due = piece2.token_end;
  while (due < 64) {
    transport::ReceivedChunk raw;
    const CodeChunk piece = next(&raw);
    raw.payload.Reset();
    EXPECT_EQ(piece.token_begin, due);
    EXPECT_LE(piece.shape.back(), 8);
    due = piece.token_end;
  }
  ASSERT_TRUE(sender.Finish().ok());
  EXPECT_EQ(sender.report().lowered, std::vector<int>{0});
  std::thread trailer([&] { EXPECT_TRUE(session->Finish().ok()) << session->status(); });
  auto end = incoming->Next(absl::Seconds(30));
  EXPECT_TRUE(end.ok() && !end->has_value());
  trailer.join();
}

}  // namespace
}  // namespace scd::producer
