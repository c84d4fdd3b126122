// Layer-wise streaming end to end over real transports: the producer's prefill hands each layer
// to StreamPrefill's encoders and sessions as it is computed, the consumer's ReceiveIntoCache
// rebuilds each layer as it arrives; the consumer's cache equals the batch decoder's on the same
// codes, bit for bit (hard pair, scd), on every backend. A fan-out runs one prefill for two
// consumers (scd and raw); a consumer expecting another mode refuses the header and the producer
// hears why; no transport buffer outlives the sessions.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "base/awaited.h"
#include "base/work_queue.h"
#include "codec/chunk_rows.h"
#include "codec/code_decoder.h"
#include "codec/code_encoder.h"
#include "codec/fingerprint.h"
#include "consumer/code_receiver.h"
#include "producer/prefill_streamer.h"
#include "tests/test_util.h"
#include "tests/transport_test_util.h"
#include "transport/transfer_session.h"

namespace scd {
namespace {

using ::testing::HasSubstr;

// One producer -> consumer pair's codec side: plan, encoder, decoder, reference cache.
struct Pair {
  TransferOptions options;
  TransferPlan plan;
  std::unique_ptr<CodeEncoder> encoder;
  std::unique_ptr<CodeDecoder> decoder;
  std::vector<PlannedChunk> expected;
};

// ReceiveIntoCache, waited for: its steps on a queue of their own, everything within 30 s.
absl::StatusOr<consumer::ReceiveReport> Receive(std::shared_ptr<transport::ReceiveSession> session,
                                                const Pair& pair,
                                                const std::vector<TokenId>& prompt,
                                                KvCache* cache) {
  WorkQueue steps(1);
  consumer::ReceiveOptions options;
  options.deadline = absl::Now() + absl::Seconds(30);
  options.post = [&steps](std::function<void()> job) { steps.Run(std::move(job)); };
  Awaited<absl::StatusOr<consumer::ReceiveReport>> received;
  consumer::ReceiveIntoCache(std::move(session), *pair.decoder, pair.plan, pair.expected, prompt,
                             cache, std::move(options), received.Setter());
  return received.Wait();
}

class LayerwiseStreamingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    producer_ = testing::Ok(LlamaModel::Load(testing::ModelDir("stories260k"), {}));
    consumer_ = testing::Ok(LlamaModel::Load(testing::ModelDir("llama2xs-260k"), {}));
    artifact_ = testing::SyntheticArtifact(*producer_);
    artifact_.consumer = testing::Ok(ModelIdentity::Of(*consumer_));
    prompt_ = testing::LoadGolden("stories260k").prompts[2].ids;
  }
  Pair MakePair(TransferMode mode, const LlamaModel& consumer) {
    Pair pair;
    const Artifact* used = ModeNeedsArtifact(mode) ? &artifact_ : nullptr;
    pair.plan = testing::Ok(TransferPlan::Make(mode, producer_->config(), used, pair.options));
    pair.encoder = std::make_unique<CodeEncoder>(pair.plan, used, pair.options);
    pair.decoder = std::make_unique<CodeDecoder>(consumer, used);
    pair.expected = testing::Ok(
        pair.encoder->PlannedChunks(producer_->config(), static_cast<int64_t>(prompt_.size())));
    return pair;
  }
  // The consumer's cache rebuilt by the batch decoder from the whole batch.
  KvCache Reference(const Pair& pair, const LlamaModel& consumer) {
    CodeBatch batch = testing::Ok(pair.encoder->Prefill(*producer_, prompt_));
    KvCache cache = consumer.NewCache(64);
    EXPECT_TRUE(pair.decoder->Decode(batch, prompt_, &cache).ok());
    return cache;
  }

  std::unique_ptr<LlamaModel> producer_, consumer_;
  Artifact artifact_;
  std::vector<TokenId> prompt_;
};

TEST_F(LayerwiseStreamingTest, StreamedScdRebuildsTheBatchDecodersCacheOnEveryBackend) {
  Pair pair = MakePair(TransferMode::kScd, *consumer_);
  KvCache reference = Reference(pair, *consumer_);
  TransferIdentity identity{"req-stream", testing::Ok(FingerprintModel(*producer_)),
                            testing::Ok(FingerprintModel(*consumer_)), "synthetic"};
  for (const std::string& backend : transport::AvailableBackends()) {
    SCOPED_TRACE(backend);
    {
      transport::ConnectionOptions receiver_options;
      receiver_options.expected_producer_fingerprint = identity.producer_fingerprint;
      receiver_options.expected_consumer_fingerprint = identity.consumer_fingerprint;
      testing::SessionPeers peers = testing::ConnectSessions(backend, receiver_options);
      auto header = testing::Ok(producer::StreamHeader(
          *pair.encoder, producer_->config(), static_cast<int64_t>(prompt_.size()), identity));
      auto session = testing::Ok(peers.sender->StartSession(header, absl::Seconds(30)));

      KvCache cache = consumer_->NewCache(64);
      absl::StatusOr<consumer::ReceiveReport> received;
      std::thread receiver([&] {
        auto incoming = peers.acceptor->Accept(absl::Seconds(10));
        ASSERT_TRUE(incoming.ok()) << incoming.status();
        received = Receive(*incoming, pair, prompt_, &cache);
      });
      producer::StreamReport sent = testing::Ok(
          producer::StreamPrefill(*producer_, prompt_, {{pair.encoder.get(), session}}));
      receiver.join();
      ASSERT_TRUE(received.ok()) << received.status();
      ASSERT_TRUE(sent.targets[0].ok()) << sent.targets[0];
      EXPECT_EQ(sent.layers_run, producer_->config().num_layers);
      EXPECT_EQ(sent.chunks, static_cast<int64_t>(pair.expected.size()));
      EXPECT_EQ(received->chunks, sent.chunks);
      EXPECT_EQ(static_cast<uint64_t>(received->bytes), header.expected_bytes());
      EXPECT_LE(received->first_chunk, received->first_layer_ready);
      testing::ExpectSameCache(cache, reference, backend);
    }
    EXPECT_EQ(transport::LiveTransportBuffers(), 0);
  }
}

TEST_F(LayerwiseStreamingTest, FanOutRunsOnePrefillForTwoConsumers) {
  // stories260k -> llama2xs-260k in scd (artifact), stories260k -> itself in raw.
  Pair scd = MakePair(TransferMode::kScd, *consumer_);
  Pair raw = MakePair(TransferMode::kRaw, *producer_);
  KvCache scd_reference = Reference(scd, *consumer_);
  KvCache raw_reference = Reference(raw, *producer_);
  testing::SessionPeers peers = testing::ConnectSessions("inproc");
  const int64_t T = static_cast<int64_t>(prompt_.size());
  auto scd_session = testing::Ok(peers.sender->StartSession(
      testing::Ok(producer::StreamHeader(*scd.encoder, producer_->config(), T, {"a", "", "", ""})),
      absl::Seconds(30)));
  auto raw_session = testing::Ok(peers.sender->StartSession(
      testing::Ok(producer::StreamHeader(*raw.encoder, producer_->config(), T, {"b", "", "", ""})),
      absl::Seconds(30)));

  KvCache scd_cache = consumer_->NewCache(64), raw_cache = producer_->NewCache(64);
  // The two sessions interleave on one connection; each is drained by its own thread, as the
  // consumer daemon's workers do.
  std::vector<std::thread> drains;
  std::vector<absl::Status> drained(2);
  std::thread receiver([&] {
    for (int i = 0; i < 2; ++i) {
      auto incoming = peers.acceptor->Accept(absl::Seconds(10));
      ASSERT_TRUE(incoming.ok()) << incoming.status();
      const int which = (*incoming)->request_id() == "a" ? 0 : 1;
      drains.emplace_back([&, session = *incoming, which] {
        const Pair& pair = which == 0 ? scd : raw;
        drained[which] =
            Receive(session, pair, prompt_, which == 0 ? &scd_cache : &raw_cache).status();
      });
    }
  });
  producer::StreamReport sent = testing::Ok(producer::StreamPrefill(
      *producer_, prompt_, {{scd.encoder.get(), scd_session}, {raw.encoder.get(), raw_session}}));
  receiver.join();
  for (std::thread& drain : drains) drain.join();
  EXPECT_EQ(sent.layers_run, producer_->config().num_layers);  // one prefill
  EXPECT_TRUE(sent.targets[0].ok()) << sent.targets[0];
  EXPECT_TRUE(sent.targets[1].ok()) << sent.targets[1];
  EXPECT_TRUE(drained[0].ok()) << drained[0];
  EXPECT_TRUE(drained[1].ok()) << drained[1];
  testing::ExpectSameCache(scd_cache, scd_reference, "scd");
  testing::ExpectSameCache(raw_cache, raw_reference, "raw");
}

TEST_F(LayerwiseStreamingTest, ConsumerExpectingAnotherModeRefusesAndTheProducerHearsWhy) {
  Pair sent_pair = MakePair(TransferMode::kScd, *consumer_);
  Pair expected_pair = MakePair(TransferMode::kRaw, *consumer_);
  testing::SessionPeers peers = testing::ConnectSessions("inproc");
  auto session = testing::Ok(peers.sender->StartSession(
      testing::Ok(producer::StreamHeader(*sent_pair.encoder, producer_->config(),
                                         static_cast<int64_t>(prompt_.size()), {"r", "", "", ""})),
      absl::Seconds(30)));
  absl::Status refused;
  std::thread receiver([&] {
    auto incoming = peers.acceptor->Accept(absl::Seconds(10));
    ASSERT_TRUE(incoming.ok()) << incoming.status();
    KvCache cache = consumer_->NewCache(64);
    refused = Receive(*incoming, expected_pair, prompt_, &cache).status();
  });
  receiver.join();  // refuses on the header, before the producer sends anything
  producer::StreamReport sent = testing::Ok(
      producer::StreamPrefill(*producer_, prompt_, {{sent_pair.encoder.get(), session}}));
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("mode scd, expected raw"));
  EXPECT_FALSE(sent.targets[0].ok());
  EXPECT_THAT(std::string(sent.targets[0].message()), HasSubstr("mode scd, expected raw"));
  EXPECT_LT(sent.layers_run, producer_->config().num_layers + 1);
}

// Streams `pair` to an adapting target under `budget`, the header saying `adaptive`; returns
// what the consumer received (or why it refused) and fills `cache` and `sent`.
absl::StatusOr<consumer::ReceiveReport> StreamAdapting(
    const LlamaModel& producer, const Pair& pair,
    const std::vector<TokenId>& prompt, AdaptBudget budget, bool adaptive_header, KvCache* cache,
    producer::StreamReport* sent, double gbps = 0, size_t max_window = 0) {
  transport::ConnectionOptions sender;
  sender.shape.gbps = gbps;  // 0: unshaped
  sender.shape.burst_bytes = 1;
  testing::SessionPeers peers = testing::ConnectSessions("inproc", {}, sender);
  v1::TransferHeader header = testing::Ok(producer::StreamHeader(
      *pair.encoder, producer.config(), static_cast<int64_t>(prompt.size()), {"a", "", "", ""}));
  header.set_adaptive(adaptive_header);
  auto session = testing::Ok(peers.sender->StartSession(header, absl::Seconds(30)));
  absl::StatusOr<consumer::ReceiveReport> received;
  std::thread receiver([&] {
    auto incoming = peers.acceptor->Accept(absl::Seconds(10));
    ASSERT_TRUE(incoming.ok()) << incoming.status();
    received = Receive(*incoming, pair, prompt, cache);
  });
  producer::StreamTarget target{pair.encoder.get(), session};
  target.adapt = budget;
  target.adapt_max_window = max_window;
  *sent = testing::Ok(producer::StreamPrefill(producer, prompt, {target}));
  receiver.join();
  return received;
}

TEST_F(LayerwiseStreamingTest, AnAdaptedTransferRebuildsAnEncodeAtTheRanksThatArrived) {
  Pair pair = MakePair(TransferMode::kScd, *consumer_);
  const int layers = static_cast<int>(producer_->config().num_layers);
  {
    // A budget the plan meets: every layer at the plan's ranks, the plan's cache bit for bit.
    KvCache cache = consumer_->NewCache(64);
    producer::StreamReport sent;
    auto received = StreamAdapting(*producer_, pair, prompt_,
                                   {absl::Hours(1), 1e12}, true, &cache, &sent);
    ASSERT_TRUE(received.ok()) << received.status();
    EXPECT_TRUE(received->lowered.empty());
    EXPECT_TRUE(sent.lowered[0].empty());
    EXPECT_EQ(received->bytes, TotalBytes(pair.expected));
    testing::ExpectSameCache(cache, Reference(pair, *consumer_), "kept ranks");
  }
  // A deadline already past when the first layer is ready, over a link of 1.25 kB/s: no time
  // for any code beyond rank 1 (the pass's own pace gives the link a few milliseconds).
  KvCache cache = consumer_->NewCache(64);
  producer::StreamReport sent;
  auto received = StreamAdapting(*producer_, pair, prompt_, {absl::Microseconds(1), 1.0},
                                 true, &cache, &sent, 1e-5);
  ASSERT_TRUE(received.ok()) << received.status();
  ASSERT_TRUE(sent.targets[0].ok()) << sent.targets[0];
  EXPECT_LT(received->bytes, TotalBytes(pair.expected));
  std::vector<int> code_layers, lowered_layers;
  for (const PlannedChunk& chunk : pair.expected) {
    if (code_layers.empty() || code_layers.back() != chunk.layer) code_layers.push_back(chunk.layer);
  }
  for (const consumer::LoweredLayer& l : received->lowered) lowered_layers.push_back(l.layer);
  EXPECT_EQ(lowered_layers, code_layers);  // every layer with a code of rank > 1 came at rank 1
  EXPECT_EQ(sent.lowered[0], code_layers);
  // The reference: the producer encoding at exactly those ranks, the batch decoder rebuilding.
  Pair at_ranks;
  at_ranks.options.layer_rank_k.assign(layers, 0);
  at_ranks.options.layer_rank_v.assign(layers, 0);
  at_ranks.options.layer_rank_h.assign(layers, 0);
  for (const consumer::LoweredLayer& l : received->lowered) {
    EXPECT_TRUE(l.rank_k == 1 || l.rank_k == 0) << l.layer;
    at_ranks.options.layer_rank_k[l.layer] = l.rank_k;
    at_ranks.options.layer_rank_v[l.layer] = l.rank_v;
    at_ranks.options.layer_rank_h[l.layer] = l.rank_h;
  }
  at_ranks.plan = testing::Ok(
      TransferPlan::Make(TransferMode::kScd, producer_->config(), &artifact_, at_ranks.options));
  at_ranks.encoder = std::make_unique<CodeEncoder>(at_ranks.plan, &artifact_, at_ranks.options);
  at_ranks.decoder = std::make_unique<CodeDecoder>(*consumer_, &artifact_);
  testing::ExpectSameCache(cache, Reference(at_ranks, *consumer_), "lowered ranks");
  EXPECT_FALSE(at::equal(cache.keys(code_layers.back()),
                         Reference(pair, *consumer_).keys(code_layers.back())));

  // Lower ranks under a header that did not announce adaptation: refused, naming the chunk.
  KvCache refused_cache = consumer_->NewCache(64);
  auto refused = StreamAdapting(*producer_, pair, prompt_, {absl::Microseconds(1), 1.0},
                                false, &refused_cache, &sent, 1e-5);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("the plan's ["));
  EXPECT_FALSE(sent.targets[0].ok());
}

// The link drops under a transfer planned at 10 MB/s (it gives 1.56 kB/s): the producer hands
// each layer over in pieces of positions as the link takes them, the first ones at the plan's
// ranks (nothing measured yet), the later ones lower once the drain shows the rate. (The 4.5 kB
// planned need 0.5 ms of the 1 s budget at the plan's rate, so a loaded machine holding the pass
// up for hundreds of milliseconds does not lower the first pieces too; the link needs ~3 s.) The
// consumer joins pieces of different ranks; its cache equals the batch decoder's on the full encode
// with each piece's columns beyond the rank it came at set to zero (the nested code at that rank),
// row by row, bit for bit.
TEST_F(LayerwiseStreamingTest, PiecesOfALayerSentAtDifferentRanksRebuildEachAtItsOwn) {
  Pair pair = MakePair(TransferMode::kScd, *consumer_);
  const int64_t T = static_cast<int64_t>(prompt_.size());
  KvCache cache = consumer_->NewCache(64);
  producer::StreamReport sent;
  auto received = StreamAdapting(*producer_, pair, prompt_, {absl::Seconds(1), 1e7}, true, &cache,
                                 &sent, 1.25e-5, 256);
  ASSERT_TRUE(received.ok()) << received.status();
  ASSERT_TRUE(sent.targets[0].ok()) << sent.targets[0];
  ASSERT_FALSE(received->lowered_pieces.empty());
  EXPECT_GT(received->chunks, static_cast<int64_t>(pair.expected.size()));  // in pieces
  EXPECT_LT(received->bytes, TotalBytes(pair.expected));
  EXPECT_EQ(received->lowered.size(), sent.lowered[0].size());

  // The reference: the whole encode, each row's columns beyond the rank it arrived at zeroed.
  CodeBatch batch = testing::Ok(pair.encoder->Prefill(*producer_, prompt_));
  bool mixed = false;  // some code came at more than one rank
  for (CodeChunk& chunk : batch.chunks) {
    if (!IsCodeKind(chunk.kind)) continue;
    const int64_t full = chunk.shape.back();
    std::vector<int64_t> rank(static_cast<size_t>(T), full);
    for (const consumer::LoweredPiece& piece : received->lowered_pieces) {
      if (piece.layer != chunk.layer || piece.kind != chunk.kind) continue;
      for (int64_t t = piece.token_begin; t < piece.token_end; ++t) rank[t] = piece.rank;
    }
    const int64_t top = *std::max_element(rank.begin(), rank.end());
    const int64_t bottom = *std::min_element(rank.begin(), rank.end());
    if (bottom == full) continue;
    at::Tensor values = testing::Ok(UnpackTensor(chunk, at::kCPU));  // [.., T, r]
    for (int64_t t = 0; t < T; ++t) {
      values.narrow(-2, t, 1).narrow(-1, rank[t], full - rank[t]).zero_();
    }
    // Pieces of one rank travel at it; of several, zero-padded to the highest (JoinMixedRankRows).
    CodeChunk at_ranks = PackTensor(values.narrow(-1, 0, top), WireDtype::kF32);
    mixed |= top != bottom;
    at_ranks.layer = chunk.layer;
    at_ranks.kind = chunk.kind;
    at_ranks.token_begin = chunk.token_begin;
    at_ranks.token_end = chunk.token_end;
    chunk = std::move(at_ranks);
  }
  EXPECT_TRUE(mixed) << "no layer's pieces came at different ranks";
  KvCache reference = consumer_->NewCache(64);
  ASSERT_TRUE(pair.decoder->Decode(batch, prompt_, &reference).ok());
  testing::ExpectSameCache(cache, reference, "pieces at their ranks");
}

}  // namespace
}  // namespace scd
