// proto/code_chunk_framing: every mode and wire dtype of a real batch frames into scd.v1 messages
// and back bit-exactly; a real scd-mode batch of the hard pair's producer (stories260k, encoded
// for llama2xs-260k) crosses every transport backend bit-exactly; mismatched fields are refused.
#include "proto/code_chunk_framing.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <thread>

#include "codec/code_encoder.h"
#include "codec/fingerprint.h"
#include "codec/transfer_plan.h"
#include "tests/test_util.h"
#include "tests/transport_test_util.h"
#include "transport/transfer_session.h"

namespace scd {
namespace {

using testing::ExpectSameChunk;

class CodeChunkFramingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    producer_ = testing::Ok(LlamaModel::Load(testing::ModelDir("stories260k"), {}));
    consumer_ = testing::Ok(LlamaModel::Load(testing::ModelDir("llama2xs-260k"), {}));
    artifact_ = testing::SyntheticArtifact(*producer_);
    artifact_.consumer = testing::Ok(ModelIdentity::Of(*consumer_));
    prompt_ = testing::LoadGolden("stories260k").prompts[2].ids;
  }
  CodeBatch Encode(TransferMode mode, WireDtype dtype) {
    TransferOptions options;
    options.code_dtype = options.raw_dtype = dtype;
    TransferPlan plan =
        testing::Ok(TransferPlan::Make(mode, producer_->config(), &artifact_, options));
    return testing::Ok(CodeEncoder(plan, &artifact_, options).Prefill(*producer_, prompt_));
  }
  std::unique_ptr<LlamaModel> producer_, consumer_;
  Artifact artifact_;
  std::vector<TokenId> prompt_;
};

TEST_F(CodeChunkFramingTest, EveryModeAndDtypeRoundTripsBitExactly) {
  for (TransferMode mode : kAllTransferModes) {
    for (WireDtype dtype :
         {WireDtype::kF32, WireDtype::kF16, WireDtype::kBF16, WireDtype::kInt8, WireDtype::kInt4}) {
      const std::string where = TransferModeName(mode) + "/" + WireDtypeName(dtype);
      CodeBatch batch = Encode(mode, dtype);
      v1::TransferHeader header = FrameHeader(batch, producer_->config().num_layers, {});
      EXPECT_EQ(header.expected_bytes(), static_cast<uint64_t>(batch.bytes())) << where;
      EXPECT_EQ(header.expected_chunks(), batch.chunks.size()) << where;
      EXPECT_EQ(testing::Ok(ModeFromProto(header.mode())), mode);
      uint64_t bytes = 0;
      for (size_t i = 0; i < batch.chunks.size(); ++i) {
        FramedChunk framed = FrameChunk(batch.chunks[i]);
        // Through the serialized message, as a backend would carry it.
        v1::CodeChunk meta;
        ASSERT_TRUE(meta.ParseFromString(framed.meta.SerializeAsString()));
        bytes += framed.size + meta.scales().size();
        absl::StatusOr<CodeChunk> back = UnframeChunk(
            meta, absl::string_view(reinterpret_cast<const char*>(framed.data), framed.size),
            batch.tokens);
        ASSERT_TRUE(back.ok()) << where << ": " << back.status();
        ExpectSameChunk(*back, batch.chunks[i], where);
      }
      EXPECT_EQ(bytes, header.expected_bytes()) << where;
    }
  }
}

TEST_F(CodeChunkFramingTest, MismatchedFieldsAreRefused) {
  CodeBatch batch = Encode(TransferMode::kScd, WireDtype::kInt8);
  FramedChunk framed = FrameChunk(batch.chunks[0]);
  const absl::string_view payload(reinterpret_cast<const char*>(framed.data), framed.size);
  v1::CodeChunk meta = framed.meta;
  meta.set_shape(0, meta.shape(0) + 1);
  EXPECT_TRUE(absl::IsInvalidArgument(UnframeChunk(meta, payload, batch.tokens).status()));
  meta = framed.meta;
  meta.set_token_end(batch.tokens + 1);
  EXPECT_TRUE(absl::IsInvalidArgument(UnframeChunk(meta, payload, batch.tokens).status()));
  meta = framed.meta;
  meta.set_kind(static_cast<v1::ChunkKind>(17));
  EXPECT_TRUE(absl::IsInvalidArgument(UnframeChunk(meta, payload, batch.tokens).status()));
  meta = framed.meta;
  meta.set_scales("");
  EXPECT_TRUE(absl::IsInvalidArgument(UnframeChunk(meta, payload, batch.tokens).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(ModeFromProto(static_cast<v1::Mode>(9)).status()));
}

TEST_F(CodeChunkFramingTest, RealScdBatchCrossesEveryBackendBitExactly) {
  CodeBatch batch = Encode(TransferMode::kScd, WireDtype::kF16);
  TransferIdentity identity{"req-hard-pair", testing::Ok(FingerprintModel(*producer_)),
                            testing::Ok(FingerprintModel(*consumer_)), "synthetic"};
  for (const std::string& backend : transport::AvailableBackends()) {
    SCOPED_TRACE(backend);
    transport::ConnectionOptions receiver_options;
    receiver_options.expected_producer_fingerprint = identity.producer_fingerprint;
    receiver_options.expected_consumer_fingerprint = identity.consumer_fingerprint;
    testing::SessionPeers peers = testing::ConnectSessions(backend, receiver_options);
    auto session = testing::Ok(peers.sender->StartSession(
        FrameHeader(batch, producer_->config().num_layers, identity), absl::Seconds(30)));
    std::thread sender([&] {
      for (const CodeChunk& chunk : batch.chunks) {
        FramedChunk framed = FrameChunk(chunk);
        ASSERT_TRUE(
            session
                ->SendChunk(framed.meta, transport::Payload(framed.data, framed.size, framed.owner))
                .ok());
      }
      EXPECT_TRUE(session->Finish().ok()) << session->status();
    });
    auto received = testing::Ok(peers.acceptor->Accept(absl::Seconds(10)));
    EXPECT_EQ(received->header().mode(), v1::MODE_SCD);
    EXPECT_EQ(received->header().tokens(), static_cast<uint64_t>(batch.tokens));
    size_t i = 0;
    for (;; ++i) {
      auto chunk = received->Next(absl::Seconds(10));
      ASSERT_TRUE(chunk.ok()) << chunk.status();
      if (!chunk->has_value()) break;
      ASSERT_LT(i, batch.chunks.size());
      CodeChunk back = testing::Ok(UnframeChunk((*chunk)->meta, (*chunk)->payload.view(),
                                                static_cast<int64_t>(received->header().tokens())));
      ExpectSameChunk(back, batch.chunks[i], backend);
    }
    sender.join();
    EXPECT_EQ(i, batch.chunks.size());
    EXPECT_EQ(received->state(), transport::SessionState::kCompleted);
    EXPECT_EQ(received->stats().bytes, static_cast<uint64_t>(batch.bytes()));
  }
}

}  // namespace
}  // namespace scd
