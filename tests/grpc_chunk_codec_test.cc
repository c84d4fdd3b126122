// The gRPC backend's wire encoding without a server: every frame kind cut into messages at a small
// limit and put back together equals what was sent (control messages may come between a chunk's
// pieces); what a broken peer could send is refused with DataLoss; PrepareFrame refuses frames the
// link cannot carry.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "base/crc32c.h"
#include "scd/v1/transfer.pb.h"
#include "tests/transport_test_util.h"
#include "transport/grpc/chunk_codec.h"

namespace scd::transport::grpc_internal {
namespace {

using ::scd::testing::PatternBytes;
using ::scd::testing::ValidChunk;
using ::scd::testing::ValidControl;
using ::scd::testing::ValidHeader;

constexpr size_t kLimit = 1000;  // payload bytes per message

std::vector<grpc::ByteBuffer> Messages(Frame frame) {
  absl::StatusOr<OutFrame> out = PrepareFrame(std::move(frame), kLimit + kMetaAllowance);
  EXPECT_TRUE(out.ok()) << out.status();
  std::vector<grpc::ByteBuffer> messages;
  if (!out.ok()) return messages;
  do {
    messages.push_back(NextMessage(&*out, kLimit));
  } while (!out->done());
  return messages;
}

void ExpectSame(const Frame& have, const Frame& want) {
  EXPECT_EQ(have.type, want.type);
  EXPECT_EQ(have.session_id, want.session_id);
  v1::TransferFrame a, b;
  ASSERT_TRUE(a.ParseFromString(have.meta));
  ASSERT_TRUE(b.ParseFromString(want.meta));
  EXPECT_EQ(a.SerializeAsString(), b.SerializeAsString()) << a.ShortDebugString();
  EXPECT_TRUE(have.payload.view() == want.payload.view());
}

TEST(GrpcChunkCodecTest, EveryFrameRoundTripsThroughMessagesAtTheLimit) {
  Reassembler reassembler(ReceivePool::Create({}));
  std::vector<Frame> frames = {ValidHeader(1, 3, 5000), ValidControl(FrameType::kAck, 1, 9)};
  for (size_t size :
       {size_t{0}, size_t{1}, kLimit - 1, kLimit, kLimit + 1, 3 * kLimit + 500, size_t{300000}}) {
    const std::string bytes = PatternBytes(size, static_cast<uint32_t>(size));
    frames.push_back(ValidChunk(1, static_cast<uint32_t>(size), Payload::Copy(bytes.data(), size)));
  }
  for (const Frame& frame : frames) {
    std::vector<grpc::ByteBuffer> messages = Messages(frame);
    const size_t expected = frame.type == FrameType::kChunk && frame.payload.size() > kLimit
                                ? (frame.payload.size() + kLimit - 1) / kLimit
                                : 1;
    EXPECT_EQ(messages.size(), expected);
    std::optional<Frame> result;
    for (size_t i = 0; i < messages.size(); ++i) {
      absl::StatusOr<std::optional<Frame>> taken = reassembler.Take(messages[i]);
      ASSERT_TRUE(taken.ok()) << taken.status();
      EXPECT_EQ(taken->has_value(), i + 1 == messages.size());
      if (taken->has_value()) result = std::move(**taken);
    }
    ASSERT_TRUE(result.has_value());
    ExpectSame(*result, frame);
    if (frame.type == FrameType::kChunk) {  // checksummed in the copy out of the messages
      ASSERT_TRUE(result->payload_crc.has_value());
      EXPECT_EQ(*result->payload_crc, Crc32cSoftware(frame.payload.data(), frame.payload.size()));
    }
  }
}

TEST(GrpcChunkCodecTest, ControlMessagesMayComeBetweenPieces) {
  Reassembler reassembler(ReceivePool::Create({}));
  const std::string bytes = PatternBytes(5 * kLimit, 3);
  const Frame chunk = ValidChunk(2, 0, Payload::Copy(bytes.data(), bytes.size()));
  std::vector<grpc::ByteBuffer> pieces = Messages(chunk);
  ASSERT_EQ(pieces.size(), 5u);
  const Frame credit = ValidControl(FrameType::kCredit, 2, 77);
  for (size_t i = 0; i < pieces.size(); ++i) {
    auto taken = reassembler.Take(pieces[i]);
    ASSERT_TRUE(taken.ok()) << taken.status();
    if (i + 1 == pieces.size()) {
      ASSERT_TRUE(taken->has_value());
      ExpectSame(**taken, chunk);
      continue;
    }
    auto control = reassembler.Take(Messages(credit)[0]);
    ASSERT_TRUE(control.ok()) << control.status();
    ASSERT_TRUE(control->has_value());
    ExpectSame(**control, credit);
  }
}

TEST(GrpcChunkCodecTest, WhatABrokenPeerSendsIsDataLoss) {
  const std::string bytes = PatternBytes(3 * kLimit, 5);
  const Frame chunk = ValidChunk(3, 0, Payload::Copy(bytes.data(), bytes.size()));
  std::vector<grpc::ByteBuffer> pieces = Messages(chunk);
  auto refused = [](Reassembler& r, const grpc::ByteBuffer& message, const char* what) {
    absl::StatusOr<std::optional<Frame>> taken = r.Take(message);
    EXPECT_TRUE(absl::IsDataLoss(taken.status())) << what << ": " << taken.status();
  };
  {
    Reassembler r(ReceivePool::Create({}));
    refused(r, pieces[1], "a piece without its chunk");
  }
  {
    Reassembler r(ReceivePool::Create({}));
    ASSERT_TRUE(r.Take(pieces[0]).ok());
    refused(r, pieces[0], "a chunk while the previous one still expects bytes");
  }
  {
    Reassembler r(ReceivePool::Create({}));
    ASSERT_TRUE(r.Take(pieces[0]).ok());
    refused(r, Messages(ValidHeader(3, 1))[0], "a data frame inside a chunk");
  }
  {
    Reassembler r(ReceivePool::Create({}));
    ASSERT_TRUE(r.Take(pieces[0]).ok());
    ASSERT_TRUE(r.Take(pieces[1]).ok());
    const std::string other = PatternBytes(5 * kLimit, 6);
    refused(r, Messages(ValidChunk(3, 0, Payload::Copy(other.data(), other.size())))[2],
            "a piece of another size");
  }
  {
    Reassembler r(ReceivePool::Create({}));
    const std::string garbage = "\xff\xff\xff";
    grpc::Slice slice(garbage);
    refused(r, grpc::ByteBuffer(&slice, 1), "bytes that are no TransferFrame");
  }
}

TEST(GrpcChunkCodecTest, PrepareFrameRefusesWhatTheLinkCannotCarry) {
  auto refused = [](Frame frame, const char* what) {
    absl::StatusOr<OutFrame> out = PrepareFrame(std::move(frame), kLimit + kMetaAllowance);
    EXPECT_TRUE(absl::IsInvalidArgument(out.status())) << what << ": " << out.status();
  };
  Frame not_proto = ValidHeader(1, 1);
  not_proto.meta = "\xff\xff";
  refused(not_proto, "meta that is no TransferFrame");
  Frame wrong_type = ValidHeader(1, 1);
  wrong_type.type = FrameType::kTrailer;
  refused(wrong_type, "a type its meta does not carry");
  Frame wrong_session = ValidHeader(1, 1);
  wrong_session.session_id = 2;
  refused(wrong_session, "a session its meta does not name");
  Frame payload_on_control = ValidControl(FrameType::kAck, 1, 1);
  payload_on_control.payload = Payload::Copy("x", 1);
  refused(payload_on_control, "a payload on a control frame");
  Frame short_payload = ValidChunk(1, 0, Payload::Copy("abc", 3));
  short_payload.payload = Payload::Copy("ab", 2);
  refused(short_payload, "payload_bytes that differ from the payload");
}

}  // namespace
}  // namespace scd::transport::grpc_internal
