// TransferSession over every backend this build has: ordering and bytes, backpressure, cancel
// from either side, deadlines, integrity and version/fingerprint refusals, liveness of a frozen
// peer, many sessions at once. Faults come from the FaultInjectingLink wrapper; the
// multi-process versions (kill -9, SIGSTOP, a silent veth link) are in transport_process_test.
#include "transport/transfer_session.h"

#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "base/awaited.h"
#include "base/work_queue.h"
#include "tests/transport_test_util.h"
#include "transport/fault_injection.h"

namespace scd::transport {
namespace {

using ::scd::testing::PatternBytes;

using Peers = ::scd::testing::SessionPeers;

class TransferSessionTest : public ::testing::TestWithParam<std::string> {
 protected:
  // A receiver (acceptor) and a sender connection; `policy` wraps the sender's link.
  Peers Connect(ConnectionOptions receiver_options = {}, ConnectionOptions sender_options = {},
                FaultPolicy policy = {}) {
    return ::scd::testing::ConnectSessions(GetParam(), std::move(receiver_options),
                                           std::move(sender_options), std::move(policy));
  }

  void SetUp() override {
    TransportOptions options;
    options.backend = GetParam();
    auto transport = CreateTransport(options);
    if (!transport.ok()) GTEST_SKIP() << transport.status();
  }
};

v1::TransferHeader Header(const std::string& request_id) {
  v1::TransferHeader header;
  header.set_request_id(request_id);
  header.set_mode(v1::MODE_SCD);
  header.set_producer_fingerprint("producer-fp");
  header.set_consumer_fingerprint("consumer-fp");
  return header;
}

v1::CodeChunk ChunkMeta(int layer) {
  v1::CodeChunk chunk;
  chunk.set_layer(layer);
  chunk.set_kind(v1::KIND_KEY_CODE);
  chunk.set_dtype(v1::DTYPE_F16);
  return chunk;
}

TEST_P(TransferSessionTest, ChunksArriveInOrderWithExactBytesAndBothSidesComplete) {
  Peers peers = Connect();
  auto session = peers.sender->StartSession(Header("req-order"), absl::Seconds(30));
  ASSERT_TRUE(session.ok()) << session.status();
  std::vector<std::string> sent;
  for (int i = 0; i < 40; ++i) {
    sent.push_back(PatternBytes(static_cast<size_t>(i * i * 997 % (3 << 20)), i));
  }
  std::thread sender([&] {
    for (int i = 0; i < 40; ++i) {
      v1::CodeChunk meta = ChunkMeta(i % 5);
      meta.set_scales(PatternBytes(i % 7, 100 + i));
      ASSERT_TRUE((*session)->SendChunk(meta, Payload::Copy(sent[i].data(), sent[i].size())).ok());
    }
    EXPECT_TRUE((*session)->Finish().ok()) << (*session)->status();
  });
  auto received = peers.acceptor->Accept(absl::Seconds(5));
  ASSERT_TRUE(received.ok()) << received.status();
  EXPECT_EQ((*received)->header().request_id(), "req-order");
  EXPECT_EQ((*received)->header().protocol_major(), kProtocolMajor);
  int index = 0;
  for (;;) {
    auto chunk = (*received)->Next(absl::Seconds(10));
    ASSERT_TRUE(chunk.ok()) << chunk.status();
    if (!chunk->has_value()) break;
    EXPECT_EQ((*chunk)->meta.index(), static_cast<uint32_t>(index));
    EXPECT_EQ((*chunk)->meta.layer(), static_cast<uint32_t>(index % 5));
    EXPECT_EQ((*chunk)->meta.scales(), PatternBytes(index % 7, 100 + index));
    EXPECT_EQ((*chunk)->payload.view(), sent[index]) << "chunk " << index;
    ++index;
  }
  sender.join();
  EXPECT_EQ(index, 40);
  EXPECT_EQ((*received)->state(), SessionState::kCompleted);
  ASSERT_TRUE((*session)->WaitForEnd(absl::Seconds(5)));
  EXPECT_EQ((*session)->state(), SessionState::kCompleted);
  SessionStats s = (*session)->stats(), r = (*received)->stats();
  EXPECT_EQ(s.chunks, 40u);
  EXPECT_EQ(s.bytes, r.bytes);
  EXPECT_GT(r.goodput_gbps(), 0.0);
}

// A receiver that holds no thread: every chunk is taken by a job an OnReady callback queued
// (Next(0) never waits there), each job arming the next, to the trailer; then one armed on a
// session that a cancel ends is woken by the cancel itself.
TEST_P(TransferSessionTest, OnReadyDrivesAReceiverThatHoldsNoThread) {
  Peers peers = Connect();
  auto session = peers.sender->StartSession(Header("req-ready"), absl::Seconds(30));
  ASSERT_TRUE(session.ok()) << session.status();
  auto received = peers.acceptor->Accept(absl::Seconds(5));
  ASSERT_TRUE(received.ok()) << received.status();
  struct Reader {
    std::shared_ptr<ReceiveSession> session;
    WorkQueue* steps = nullptr;
    int chunks = 0, wakes = 0;
    Awaited<absl::Status> ended;
    std::function<void(absl::Status)> end = ended.Setter();
    void Arm() {
      session->OnReady([this] { steps->Run([this] { Step(); }); });
    }
    void Step() {
      ++wakes;
      auto next = session->Next(absl::ZeroDuration());
      if (!next.ok()) return end(next.status());  // never DeadlineExceeded: it was ready
      if (!next->has_value()) return end(absl::OkStatus());
      ++chunks;
      Arm();
    }
  };
  WorkQueue steps(1);
  Reader reader;
  reader.session = *received;
  reader.steps = &steps;
  reader.Arm();
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE((*session)->SendChunk(ChunkMeta(i % 3), Payload::Copy("abcdefgh", 8)).ok());
  }
  ASSERT_TRUE((*session)->Finish().ok()) << (*session)->status();
  EXPECT_TRUE(reader.ended.Wait().ok());
  EXPECT_EQ(reader.chunks, 20);
  EXPECT_EQ(reader.wakes, 21);  // one per chunk, one for the trailer

  auto second = peers.sender->StartSession(Header("req-ready-cancel"), absl::Seconds(30));
  ASSERT_TRUE(second.ok());
  auto waiting = peers.acceptor->Accept(absl::Seconds(5));
  ASSERT_TRUE(waiting.ok());
  Awaited<absl::Status> woken;
  std::function<void(absl::Status)> wake = woken.Setter();
  std::shared_ptr<ReceiveSession> armed = *waiting;
  armed->OnReady([armed, wake] { wake(armed->Next(absl::ZeroDuration()).status()); });
  armed->Cancel("the request went away");
  EXPECT_TRUE(absl::IsCancelled(woken.Wait()));
}

// A sender that holds no thread waits for credit with OnRoomFor: told at once while the window
// has room, else when the receiver takes a chunk (its credit), or when the session ends.
TEST_P(TransferSessionTest, OnRoomForTellsASenderWhenCreditMakesRoom) {
  ConnectionOptions sender_options;
  sender_options.max_inflight_bytes = 64 << 10;
  Peers peers = Connect({}, sender_options);
  auto session = peers.sender->StartSession(Header("req-room"), absl::Seconds(30));
  ASSERT_TRUE(session.ok());
  auto received = peers.acceptor->Accept(absl::Seconds(5));
  ASSERT_TRUE(received.ok());
  const std::string block = PatternBytes(48 << 10, 9);
  bool at_once = false;
  (*session)->OnRoomFor(block.size(), [&at_once] { at_once = true; });
  EXPECT_TRUE(at_once);  // nothing in flight
  ASSERT_TRUE((*session)->SendChunk(ChunkMeta(0), Payload::Copy(block.data(), block.size())).ok());
  Awaited<bool> room;
  (*session)->OnRoomFor(block.size(), [told = room.Setter()] { told(true); });
  EXPECT_EQ((*session)->inflight_bytes(), block.size());  // 48 + 48 KiB > 64 KiB: waiting
  auto first = (*received)->Next(absl::Seconds(5));       // the credit for it
  ASSERT_TRUE(first.ok() && first->has_value());
  EXPECT_TRUE(room.Wait());
  ASSERT_TRUE((*session)->SendChunk(ChunkMeta(1), Payload::Copy(block.data(), block.size())).ok());
  Awaited<bool> ended;
  (*session)->OnRoomFor(block.size(), [told = ended.Setter()] { told(true); });
  (*received)->Cancel("the consumer went away");  // an end wakes the wait too
  EXPECT_TRUE(ended.Wait());
  EXPECT_TRUE(absl::IsCancelled((*session)->SendChunk(ChunkMeta(2), Payload::Copy("x", 1))));
}

TEST_P(TransferSessionTest, SlowReceiverKeepsSenderWithinInflightLimit) {
  ConnectionOptions sender_options;
  sender_options.max_inflight_bytes = 1 << 20;
  Peers peers = Connect({}, sender_options);
  auto session = peers.sender->StartSession(Header("req-slow"), absl::Seconds(30));
  ASSERT_TRUE(session.ok());
  const std::string block = PatternBytes(256 << 10, 7);
  std::atomic<size_t> worst{0};
  std::thread sender([&] {
    for (int i = 0; i < 32; ++i) {
      ASSERT_TRUE(
          (*session)->SendChunk(ChunkMeta(0), Payload::Copy(block.data(), block.size())).ok());
      worst = std::max(worst.load(), (*session)->inflight_bytes());
    }
    EXPECT_TRUE((*session)->Finish().ok());
  });
  auto received = peers.acceptor->Accept(absl::Seconds(5));
  ASSERT_TRUE(received.ok());
  int chunks = 0;
  for (;;) {
    // paces: a slow consumer (the scenario)
    absl::SleepFor(absl::Milliseconds(10));
    auto chunk = (*received)->Next(absl::Seconds(10));
    ASSERT_TRUE(chunk.ok()) << chunk.status();
    if (!chunk->has_value()) break;
    ++chunks;
    EXPECT_LE((*received)->queued_chunks() * block.size(), sender_options.max_inflight_bytes);
  }
  sender.join();
  EXPECT_EQ(chunks, 32);
  EXPECT_LE((*session)->stats().max_inflight_bytes, sender_options.max_inflight_bytes);
  EXPECT_LE(worst.load(), sender_options.max_inflight_bytes);
  EXPECT_GE((*session)->stats().max_inflight_bytes, block.size());
}

// Cancel reaches the other side within 100 ms, and afterwards no transport buffer and no reference
// to the sender's bytes is left.
TEST_P(TransferSessionTest, CancelFromSenderReachesReceiverAndReleasesEverything) {
  {
    Peers peers = Connect();
    testing::WatchedBytes bytes(PatternBytes(1 << 20, 3));
    auto session = peers.sender->StartSession(Header("req-cancel-s"), absl::Seconds(30));
    ASSERT_TRUE(session.ok());
    for (int i = 0; i < 4; ++i) ASSERT_TRUE((*session)->SendChunk(ChunkMeta(i), bytes.View()).ok());
    auto received = peers.acceptor->Accept(absl::Seconds(5));
    ASSERT_TRUE(received.ok());
    auto first = (*received)->Next(absl::Seconds(5));
    ASSERT_TRUE(first.ok() && first->has_value());
    first->reset();
    const absl::Time cancelled = absl::Now();
    (*session)->Cancel("client went away");
    ASSERT_TRUE((*received)->WaitForEnd(absl::Seconds(1)));
    EXPECT_LE(absl::Now() - cancelled, absl::Milliseconds(100));
    EXPECT_EQ((*received)->state(), SessionState::kCancelled);
    EXPECT_TRUE(absl::IsCancelled((*received)->status()));
    EXPECT_NE((*received)->status().message().find("client went away"), std::string::npos);
    EXPECT_TRUE(absl::IsCancelled((*session)->SendChunk(ChunkMeta(9), bytes.View())));
    // Frames already on their way are dropped when they land.
    EXPECT_TRUE(bytes.AwaitReleased(absl::Seconds(1)))
        << "the transport still holds the sender's bytes";
    EXPECT_TRUE(AwaitLiveTransportBuffers(0, absl::Now() + absl::Seconds(1)));
    EXPECT_EQ(peers.sender->open_sessions(), 0u);
  }
  EXPECT_EQ(LiveTransportBuffers(), 0);
}

// A session cancelled while its header still waits behind another session's data (a slow shaped
// link): the Cancel overtakes the header on the control lane, DropSession keeps the header, and
// the receiver hands the session out already cancelled, naming why, instead of opening a session
// that will never get a byte.
TEST_P(TransferSessionTest, ASessionCancelledBeforeItsHeaderArrivedComesOutCancelled) {
  ConnectionOptions sender_options;
  sender_options.shape.gbps = 0.05;  // 2 MiB take about 0.34 s
  Peers peers = Connect({}, sender_options);
  testing::WatchedBytes bytes(PatternBytes(2 << 20, 4));
  auto first = peers.sender->StartSession(Header("req-first"), absl::Seconds(30));
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE((*first)->SendChunk(ChunkMeta(0), bytes.View()).ok());
  auto second = peers.sender->StartSession(Header("req-second"), absl::Seconds(30));
  ASSERT_TRUE(second.ok());
  ASSERT_TRUE((*second)->SendChunk(ChunkMeta(0), bytes.View()).ok());
  (*second)->Cancel("the producer's caller called it off");
  // Aborted (the sender's own failure) before its header: handed out aborted, not cancelled.
  auto third = peers.sender->StartSession(Header("req-third"), absl::Seconds(30));
  ASSERT_TRUE(third.ok());
  (*third)->Abort("the producer's pass failed");
  std::map<std::string, std::shared_ptr<ReceiveSession>> got;
  for (int i = 0; i < 3; ++i) {
    auto received = peers.acceptor->Accept(absl::Seconds(5));
    ASSERT_TRUE(received.ok()) << received.status();
    got[(*received)->header().request_id()] = *received;
  }
  ASSERT_EQ(got.count("req-second"), 1u);
  EXPECT_EQ(got["req-second"]->state(), SessionState::kCancelled);
  EXPECT_NE(got["req-second"]->status().message().find("called it off"), std::string::npos)
      << got["req-second"]->status();
  ASSERT_EQ(got.count("req-third"), 1u);
  EXPECT_EQ(got["req-third"]->state(), SessionState::kAborted);
  EXPECT_TRUE(absl::IsAborted(got["req-third"]->status())) << got["req-third"]->status();
  EXPECT_NE(got["req-third"]->status().message().find("pass failed"), std::string::npos);
  (*first)->Cancel("done");
}

// The sender's own failure (Abort) and its caller's (Cancel) reach the receiver as different
// states: what lets a consumer ask another producer for the rest only when this one gave up.
TEST_P(TransferSessionTest, AnAbortFromTheSenderEndsTheReceiverAbortedNotCancelled) {
  Peers peers = Connect();
  testing::WatchedBytes bytes(PatternBytes(1 << 16, 5));
  auto session = peers.sender->StartSession(Header("req-abort"), absl::Seconds(30));
  ASSERT_TRUE(session.ok());
  ASSERT_TRUE((*session)->SendChunk(ChunkMeta(0), bytes.View()).ok());
  auto received = peers.acceptor->Accept(absl::Seconds(5));
  ASSERT_TRUE(received.ok());
  auto first = (*received)->Next(absl::Seconds(5));
  ASSERT_TRUE(first.ok() && first->has_value());
  (*session)->Abort("the encoder failed");
  EXPECT_EQ((*session)->state(), SessionState::kAborted);
  ASSERT_TRUE((*received)->WaitForEnd(absl::Seconds(5)));
  EXPECT_EQ((*received)->state(), SessionState::kAborted);
  EXPECT_TRUE(absl::IsAborted((*received)->status())) << (*received)->status();
  EXPECT_NE((*received)->status().message().find("sender: the encoder failed"), std::string::npos)
      << (*received)->status();
  (*session)->Cancel("too late");  // the first end stays
  EXPECT_EQ((*session)->state(), SessionState::kAborted);
}

TEST_P(TransferSessionTest, CancelFromReceiverReachesSenderAndReleasesEverything) {
  {
    ConnectionOptions sender_options;
    sender_options.max_inflight_bytes = 2 << 20;
    Peers peers = Connect({}, sender_options);
    testing::WatchedBytes bytes(PatternBytes(1 << 20, 4));
    auto session = peers.sender->StartSession(Header("req-cancel-r"), absl::Seconds(30));
    ASSERT_TRUE(session.ok());
    std::atomic<bool> sender_done{false};
    absl::Status sender_status;
    std::thread sender([&] {
      for (int i = 0; i < 1000; ++i) {  // far more than the window: blocks on credit
        sender_status = (*session)->SendChunk(ChunkMeta(i), bytes.View());
        if (!sender_status.ok()) break;
      }
      sender_done = true;
    });
    auto received = peers.acceptor->Accept(absl::Seconds(5));
    ASSERT_TRUE(received.ok());
    auto first = (*received)->Next(absl::Seconds(5));
    ASSERT_TRUE(first.ok() && first->has_value());
    first->reset();
    // waits: the sender to block on its window (SendChunk blocked is not observable); cancelled
    //  before that, it ends the same way
    absl::SleepFor(absl::Milliseconds(50));
    const absl::Time cancelled = absl::Now();
    (*received)->Cancel("consumer out of memory");
    ASSERT_TRUE((*session)->WaitForEnd(absl::Seconds(1)));
    EXPECT_LE(absl::Now() - cancelled, absl::Milliseconds(100));
    sender.join();
    EXPECT_TRUE(sender_done);
    EXPECT_TRUE(absl::IsCancelled(sender_status)) << sender_status;
    EXPECT_NE(sender_status.message().find("consumer out of memory"), std::string::npos);
    EXPECT_TRUE(bytes.AwaitReleased(absl::Seconds(1)));
    EXPECT_TRUE(AwaitLiveTransportBuffers(0, absl::Now() + absl::Seconds(1)));
  }
  EXPECT_EQ(LiveTransportBuffers(), 0);
}

TEST_P(TransferSessionTest, DeadlineEndsBothSides) {
  Peers peers = Connect();
  auto session = peers.sender->StartSession(Header("req-deadline"), absl::Milliseconds(300));
  ASSERT_TRUE(session.ok());
  ASSERT_TRUE((*session)->SendChunk(ChunkMeta(0), Payload::Copy("abcd", 4)).ok());
  auto received = peers.acceptor->Accept(absl::Seconds(5));
  ASSERT_TRUE(received.ok());
  // The producer stalls; nobody calls Finish.
  ASSERT_TRUE((*session)->WaitForEnd(absl::Seconds(2)));
  ASSERT_TRUE((*received)->WaitForEnd(absl::Seconds(2)));
  EXPECT_EQ((*session)->state(), SessionState::kDeadlineExceeded);
  EXPECT_EQ((*received)->state(), SessionState::kDeadlineExceeded);
  EXPECT_TRUE(absl::IsDeadlineExceeded((*received)->status()));
  EXPECT_LE((*session)->stats().end - (*session)->stats().start, absl::Milliseconds(500));
}

TEST_P(TransferSessionTest, CorruptedPayloadByteEndsBothSidesCorrupt) {
  FaultPolicy policy;
  FaultRule corrupt;
  corrupt.action = FaultAction::kCorrupt;
  corrupt.type = FrameType::kChunk;
  corrupt.nth = 2;
  corrupt.corrupt_offset = 12345;
  policy.rules.push_back(corrupt);
  Peers peers = Connect({}, {}, policy);
  auto session = peers.sender->StartSession(Header("req-corrupt"), absl::Seconds(30));
  ASSERT_TRUE(session.ok());
  const std::string block = PatternBytes(100000, 5);
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(
        (*session)->SendChunk(ChunkMeta(i), Payload::Copy(block.data(), block.size())).ok());
  }
  auto received = peers.acceptor->Accept(absl::Seconds(5));
  ASSERT_TRUE(received.ok());
  for (int i = 0; i < 2; ++i) {
    auto chunk = (*received)->Next(absl::Seconds(5));
    ASSERT_TRUE(chunk.ok() && chunk->has_value()) << chunk.status();
  }
  auto bad = (*received)->Next(absl::Seconds(5));
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::IsDataLoss(bad.status())) << bad.status();
  EXPECT_NE(bad.status().message().find("CRC-32C"), std::string::npos) << bad.status();
  EXPECT_NE(bad.status().message().find("chunk 2"), std::string::npos) << bad.status();
  ASSERT_TRUE((*session)->WaitForEnd(absl::Seconds(1)));
  EXPECT_EQ((*session)->state(), SessionState::kCorrupt);
  EXPECT_TRUE(absl::IsDataLoss((*session)->status()));
  EXPECT_EQ(peers.sender_faults->counters().corrupted, 1);
}

TEST_P(TransferSessionTest, UnknownMajorVersionIsRefusedWithItsOwnCode) {
  Peers peers = Connect();
  v1::TransferHeader header = Header("req-version");
  header.set_protocol_major(kProtocolMajor + 1);
  auto session = peers.sender->StartSession(header, absl::Seconds(30));
  ASSERT_TRUE(session.ok());
  ASSERT_TRUE((*session)->WaitForEnd(absl::Seconds(2)));
  EXPECT_EQ((*session)->state(), SessionState::kVersionMismatch);
  EXPECT_TRUE(absl::IsFailedPrecondition((*session)->status()));
  EXPECT_NE((*session)->status().message().find(absl::StrCat("protocol ", kProtocolMajor + 1)),
            std::string::npos)
      << (*session)->status();
  EXPECT_TRUE(absl::IsDeadlineExceeded(peers.acceptor->Accept(absl::Milliseconds(50)).status()));
}

TEST_P(TransferSessionTest, MoreBytesThanTheHeaderAnnouncedAreRefusedAsTheyArrive) {
  Peers peers = Connect();
  v1::TransferHeader header = Header("req-overflow");
  header.set_expected_bytes(1000);
  auto session = peers.sender->StartSession(header, absl::Seconds(30));
  ASSERT_TRUE(session.ok());
  auto received = peers.acceptor->Accept(absl::Seconds(5));
  ASSERT_TRUE(received.ok()) << received.status();
  testing::WatchedBytes bytes(PatternBytes(800, 1));
  ASSERT_TRUE((*session)->SendChunk(ChunkMeta(0), bytes.View()).ok());
  // 1,600 of 1,000 announced: the receiver ends the session without waiting for the trailer.
  (*session)->SendChunk(ChunkMeta(1), bytes.View()).IgnoreError();
  ASSERT_TRUE((*session)->WaitForEnd(absl::Seconds(2)));
  EXPECT_EQ((*session)->state(), SessionState::kProtocolError);
  EXPECT_NE((*session)->status().message().find("announced 1000"), std::string::npos)
      << (*session)->status();
  ASSERT_TRUE((*received)->WaitForEnd(absl::Seconds(2)));
  EXPECT_EQ((*received)->state(), SessionState::kProtocolError);
}

// An adaptive header's counts bound the transfer: bytes at most, chunks at least (an adapting
// producer sends codes in pieces, at lower ranks); an exact header's counts are exact.
TEST_P(TransferSessionTest, AnAdaptiveHeadersCountsAreACeilingAndAFloor) {
  Peers peers = Connect();
  // Sends `chunks` chunks of 100 bytes under a header announcing 3 chunks / 600 bytes; returns
  // the receiver's terminal state.
  auto run = [&](bool adaptive, int chunks) {
    v1::TransferHeader header = Header(absl::StrCat("req-adaptive-", adaptive, "-", chunks));
    header.set_expected_bytes(600);
    header.set_expected_chunks(3);
    header.set_adaptive(adaptive);
    auto session = peers.sender->StartSession(header, absl::Seconds(30));
    EXPECT_TRUE(session.ok()) << session.status();
    auto received = peers.acceptor->Accept(absl::Seconds(5));
    EXPECT_TRUE(received.ok()) << received.status();
    std::thread sender([&] {
      testing::WatchedBytes bytes(PatternBytes(100, 2));
      for (int i = 0; i < chunks; ++i)
        (*session)->SendChunk(ChunkMeta(0), bytes.View()).IgnoreError();
      (*session)->Finish().IgnoreError();
    });
    absl::StatusOr<std::optional<ReceivedChunk>> next;
    do {
      next = (*received)->Next(absl::Seconds(10));
    } while (next.ok() && next->has_value());
    sender.join();
    return (*received)->state();
  };
  EXPECT_EQ(run(true, 5), SessionState::kCompleted);  // 500 of 600 bytes, 5 chunks >= 3
  EXPECT_EQ(run(true, 3), SessionState::kCompleted);
  EXPECT_EQ(run(true, 2), SessionState::kProtocolError);   // fewer chunks than announced
  EXPECT_EQ(run(false, 6), SessionState::kProtocolError);  // 600 bytes, but 6 chunks of 3
}

TEST_P(TransferSessionTest, WrongFingerprintIsRefusedWithItsOwnCode) {
  ConnectionOptions receiver_options;
  receiver_options.expected_consumer_fingerprint = "the-real-consumer";
  Peers peers = Connect(receiver_options);
  auto session = peers.sender->StartSession(Header("req-fp"), absl::Seconds(30));
  ASSERT_TRUE(session.ok());
  ASSERT_TRUE((*session)->WaitForEnd(absl::Seconds(2)));
  EXPECT_EQ((*session)->state(), SessionState::kFingerprintMismatch);
  EXPECT_TRUE(absl::IsPermissionDenied((*session)->status()));
  EXPECT_NE((*session)->status().message().find("consumer-fp"), std::string::npos);
  EXPECT_NE((*session)->status().message().find("the-real-consumer"), std::string::npos);
}

// A frozen sender (its link stays up, nothing comes through): only the heartbeat tells.
TEST_P(TransferSessionTest, FrozenPeerEndsPeerLostWithinLiveness) {
  Peers peers = Connect();
  auto session = peers.sender->StartSession(Header("req-frozen"), absl::Seconds(30));
  ASSERT_TRUE(session.ok());
  ASSERT_TRUE((*session)->SendChunk(ChunkMeta(0), Payload::Copy("abcd", 4)).ok());
  auto received = peers.acceptor->Accept(absl::Seconds(5));
  ASSERT_TRUE(received.ok());
  // paces: idle while heartbeats keep it alive (time passing is the scenario)
  absl::SleepFor(absl::Milliseconds(1500));
  EXPECT_EQ((*received)->state(), SessionState::kOpen);
  const absl::Time frozen = absl::Now();
  peers.sender_faults->SetFrozen(true);
  ASSERT_TRUE((*received)->WaitForEnd(absl::Seconds(3)));
  ASSERT_TRUE((*session)->WaitForEnd(absl::Seconds(3)));
  EXPECT_EQ((*received)->state(), SessionState::kPeerLost);
  EXPECT_EQ((*session)->state(), SessionState::kPeerLost);
  EXPECT_TRUE(absl::IsUnavailable((*received)->status()));
  EXPECT_LE((*received)->stats().end - frozen, absl::Milliseconds(1100));
  EXPECT_LE((*session)->stats().end - frozen, absl::Milliseconds(1100));
}

TEST_P(TransferSessionTest, SixteenConcurrentSessionsOnOneListener) {
  Peers peers = Connect();
  TransportOptions options;
  options.backend = GetParam();
  const std::string address = peers.acceptor->address();
  constexpr int kSessions = 16;
  std::vector<std::thread> senders;
  for (int s = 0; s < kSessions; ++s) {
    senders.emplace_back([&, s] {
      // Half share the fixture's connection, half bring their own.
      std::shared_ptr<TransferConnection> connection = peers.sender;
      if (s % 2 == 1) {
        auto link = peers.transport->Connect(address, absl::Seconds(5));
        ASSERT_TRUE(link.ok()) << link.status();
        connection = TransferConnection::Create(*std::move(link), {});
      }
      auto session = connection->StartSession(Header(absl::StrCat("req-", s)), absl::Seconds(60));
      ASSERT_TRUE(session.ok());
      for (int i = 0; i < 8; ++i) {
        const std::string bytes = PatternBytes(50000 + 1000 * s + i, s * 100 + i);
        ASSERT_TRUE(
            (*session)->SendChunk(ChunkMeta(i), Payload::Copy(bytes.data(), bytes.size())).ok());
      }
      EXPECT_TRUE((*session)->Finish().ok()) << (*session)->status();
    });
  }
  std::vector<std::thread> receivers;
  std::atomic<int> completed{0};
  for (int s = 0; s < kSessions; ++s) {
    auto received = peers.acceptor->Accept(absl::Seconds(10));
    ASSERT_TRUE(received.ok()) << received.status();
    receivers.emplace_back([&completed, session = *received] {
      const int id = std::stoi(session->header().request_id().substr(4));
      for (int i = 0;; ++i) {
        auto chunk = session->Next(absl::Seconds(10));
        ASSERT_TRUE(chunk.ok()) << chunk.status();
        if (!chunk->has_value()) {
          EXPECT_EQ(i, 8);
          break;
        }
        EXPECT_EQ((*chunk)->payload.view(), PatternBytes(50000 + 1000 * id + i, id * 100 + i));
      }
      ++completed;
    });
  }
  for (auto& t : senders) t.join();
  for (auto& t : receivers) t.join();
  EXPECT_EQ(completed.load(), kSessions);
}

TEST_P(TransferSessionTest, ClosingTheSenderEndsTheReceiversSession) {
  Peers peers = Connect();
  auto session = peers.sender->StartSession(Header("req-close"), absl::Seconds(30));
  ASSERT_TRUE(session.ok());
  auto received = peers.acceptor->Accept(absl::Seconds(5));
  ASSERT_TRUE(received.ok());
  peers.sender->Close();
  EXPECT_EQ((*session)->state(), SessionState::kCancelled);
  ASSERT_TRUE((*received)->WaitForEnd(absl::Seconds(1)));
  EXPECT_NE((*received)->state(), SessionState::kOpen);
  EXPECT_NE((*received)->state(), SessionState::kCompleted);
}

std::vector<std::string> Backends() { return AvailableBackends(); }

INSTANTIATE_TEST_SUITE_P(Backends, TransferSessionTest, ::testing::ValuesIn(Backends()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace scd::transport
