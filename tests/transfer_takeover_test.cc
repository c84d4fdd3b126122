// A transfer taken over mid-way (issue 50): the consumer's receive loses its producer after the
// first layers (their chunks taken and rebuilt, then the session ended by the producer's side),
// keeps what it rebuilt (ReceiveProgress), and a second session -- another producer's prefill
// with StreamTarget::layer_begin, its header saying TransferHeader.layer_begin -- sends only the
// layers not rebuilt. The cache and the last prompt token's logits equal an uninterrupted
// transfer's bit for bit (the same codes; the rebuild unpaced), on every backend; the second
// session carries exactly the plan's bytes of its layers; a header from another layer than the
// first not rebuilt is refused naming both; LayerwiseRebuilder::Restart drops the chunks held for
// a layer not rebuilt (they come again).
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "base/awaited.h"
#include "base/work_queue.h"
#include "codec/code_decoder.h"
#include "codec/code_encoder.h"
#include "codec/fingerprint.h"
#include "codec/layerwise_rebuilder.h"
#include "consumer/code_receiver.h"
#include "model/layer_stepper.h"
#include "producer/adaptive_sender.h"
#include "producer/prefill_streamer.h"
#include "tests/test_util.h"
#include "tests/transport_test_util.h"
#include "transport/transfer_session.h"

namespace scd {
namespace {

using ::testing::HasSubstr;

class TransferTakeoverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    producer_ = testing::Ok(LlamaModel::Load(testing::ModelDir("stories260k"), {}));
    consumer_ = testing::Ok(LlamaModel::Load(testing::ModelDir("llama2xs-260k"), {}));
    artifact_ = testing::SyntheticArtifact(*producer_);
    artifact_.consumer = testing::Ok(ModelIdentity::Of(*consumer_));
    const std::vector<TokenId> prompt = testing::LoadGolden("stories260k").prompts[2].ids;
    prefix_.assign(prompt.begin(), prompt.end() - 1);
    last_ = prompt.back();
    plan_ = testing::Ok(
        TransferPlan::Make(TransferMode::kScd, producer_->config(), &artifact_, TransferOptions()));
    encoder_ = std::make_unique<CodeEncoder>(plan_, &artifact_, TransferOptions());
    decoder_ = std::make_unique<CodeDecoder>(*consumer_, &artifact_);
    expected_ = testing::Ok(
        encoder_->PlannedChunks(producer_->config(), static_cast<int64_t>(prefix_.size())));
    identity_ = TransferIdentity{"req-takeover", testing::Ok(FingerprintModel(*producer_)),
                                 testing::Ok(FingerprintModel(*consumer_)), "synthetic"};
    layers_ = static_cast<int>(producer_->config().num_layers);
  }

  // One consumer-side receive of the next session `peers` accept, with `progress`.
  struct Receiving {
    absl::StatusOr<consumer::ReceiveReport> result = absl::UnknownError("not run");
    std::thread thread;
  };
  void StartReceive(testing::SessionPeers& peers, const std::vector<PlannedChunk>& expected,
                    const std::shared_ptr<consumer::ReceiveProgress>& progress, KvCache* cache,
                    LayerStepper* tail, Receiving* receiving) {
    receiving->thread = std::thread([&, progress, cache, tail, receiving] {
      auto incoming = peers.acceptor->Accept(absl::Seconds(10));
      ASSERT_TRUE(incoming.ok()) << incoming.status();
      WorkQueue steps(1);
      consumer::ReceiveOptions options;
      options.deadline = absl::Now() + absl::Seconds(30);
      options.post = [&steps](std::function<void()> job) { steps.Run(std::move(job)); };
      options.tail = tail;
      options.progress = progress;
      Awaited<absl::StatusOr<consumer::ReceiveReport>> received;
      consumer::ReceiveIntoCache(*incoming, *decoder_, plan_, expected, prefix_, cache,
                                 std::move(options), received.Setter());
      receiving->result = received.Wait();
    });
  }
  v1::TransferHeader Header(int layer_begin) {
    return testing::Ok(producer::StreamHeader(*encoder_, producer_->config(),
                                              static_cast<int64_t>(prefix_.size()), identity_, 0,
                                              layer_begin));
  }
  std::shared_ptr<transport::SendSession> Open(testing::SessionPeers& peers, int layer_begin) {
    return testing::Ok(peers.sender->StartSession(Header(layer_begin), absl::Seconds(30)));
  }
  testing::SessionPeers Connect(const std::string& backend) {
    transport::ConnectionOptions receiver_options;
    receiver_options.expected_producer_fingerprint = identity_.producer_fingerprint;
    receiver_options.expected_consumer_fingerprint = identity_.consumer_fingerprint;
    return testing::ConnectSessions(backend, receiver_options);
  }
  LayerStepper Tail() {
    return testing::Ok(
        LayerStepper::Start(*consumer_, {last_}, static_cast<int64_t>(prefix_.size())));
  }

  std::unique_ptr<LlamaModel> producer_, consumer_;
  Artifact artifact_;
  std::vector<TokenId> prefix_;
  TokenId last_ = 0;
  TransferPlan plan_;
  std::unique_ptr<CodeEncoder> encoder_;
  std::unique_ptr<CodeDecoder> decoder_;
  std::vector<PlannedChunk> expected_;
  TransferIdentity identity_;
  int layers_ = 0;
};

TEST_F(TransferTakeoverTest, ASecondProducerSendsTheLayersNotRebuiltAndTheCacheIsTheSame) {
  const int cut = layers_ / 2;  // layers [0, cut) come from the first producer
  ASSERT_GT(cut, 0);
  const CodeBatch batch = testing::Ok(encoder_->Prefill(*producer_, prefix_));
  for (const std::string& backend : transport::AvailableBackends()) {
    SCOPED_TRACE(backend);
    {
      // The uninterrupted transfer.
      testing::SessionPeers whole_peers = Connect(backend);
      KvCache whole = consumer_->NewCache(64);
      LayerStepper whole_tail = Tail();
      Receiving reference;
      StartReceive(whole_peers, expected_, nullptr, &whole, &whole_tail, &reference);
      auto session = Open(whole_peers, 0);
      ASSERT_TRUE(producer::StreamPrefill(*producer_, prefix_, {{encoder_.get(), session}}).ok());
      reference.thread.join();
      ASSERT_TRUE(reference.result.ok()) << reference.result.status();

      // The first producer: the chunks of layers [0, cut), all taken, then its side ends.
      auto progress = std::make_shared<consumer::ReceiveProgress>();
      KvCache cache = consumer_->NewCache(64);
      LayerStepper tail = Tail();
      testing::SessionPeers first_peers = Connect(backend);
      Receiving first;
      StartReceive(first_peers, expected_, progress, &cache, &tail, &first);
      auto lost = Open(first_peers, 0);
      int64_t first_bytes = 0;
      for (const CodeChunk& chunk : batch.chunks) {
        if (chunk.layer >= cut) continue;
        ASSERT_TRUE(producer::SendCodeChunk(*lost, chunk, nullptr, &first_bytes).ok());
      }
      EXPECT_EQ(lost->AwaitInflightAtMost(0, absl::Now() + absl::Seconds(30)), 0u);
      lost->Cancel("the producer was lost");
      first.thread.join();
      ASSERT_FALSE(first.result.ok());
      EXPECT_EQ(progress->layers_rebuilt(), cut);
      EXPECT_EQ(tail.next_layer(), cut) << "the tail follows the layers rebuilt";

      // The second producer: every layer run, the layers from `cut` sent.
      const std::vector<PlannedChunk> rest = ChunksFromLayer(expected_, cut);
      testing::SessionPeers second_peers = Connect(backend);
      Receiving second;
      StartReceive(second_peers, rest, progress, &cache, &tail, &second);
      auto taking_over = Open(second_peers, cut);
      EXPECT_EQ(Header(cut).layer_begin(), static_cast<uint32_t>(cut));
      EXPECT_EQ(Header(cut).expected_bytes(), static_cast<uint64_t>(TotalBytes(rest)));
      producer::StreamTarget target{encoder_.get(), taking_over};
      target.layer_begin = cut;
      producer::StreamReport sent =
          testing::Ok(producer::StreamPrefill(*producer_, prefix_, {target}));
      second.thread.join();
      ASSERT_TRUE(second.result.ok()) << second.result.status();
      ASSERT_TRUE(sent.targets[0].ok()) << sent.targets[0];
      EXPECT_EQ(sent.layers_run, layers_) << "each layer's codes need the layers before";
      EXPECT_EQ(sent.chunks, static_cast<int64_t>(rest.size()));
      EXPECT_EQ(sent.bytes, TotalBytes(rest));
      // The report runs over both sessions: every chunk of the plan once.
      EXPECT_EQ(second.result->chunks, static_cast<int64_t>(expected_.size()));
      EXPECT_EQ(second.result->bytes, TotalBytes(expected_));
      testing::ExpectSameCache(cache, whole, backend);
      EXPECT_TRUE(at::equal(testing::Ok(tail.LastLogits()), testing::Ok(whole_tail.LastLogits())));
    }
    EXPECT_EQ(transport::LiveTransportBuffers(), 0);
  }
}

TEST_F(TransferTakeoverTest, AHeaderFromAnotherLayerThanTheFirstNotRebuiltIsRefused) {
  const int cut = layers_ / 2;
  const CodeBatch batch = testing::Ok(encoder_->Prefill(*producer_, prefix_));
  auto progress = std::make_shared<consumer::ReceiveProgress>();
  KvCache cache = consumer_->NewCache(64);
  testing::SessionPeers first_peers = Connect("inproc");
  Receiving first;
  StartReceive(first_peers, expected_, progress, &cache, nullptr, &first);
  auto lost = Open(first_peers, 0);
  int64_t bytes = 0;
  for (const CodeChunk& chunk : batch.chunks) {
    if (chunk.layer < cut) {
      ASSERT_TRUE(producer::SendCodeChunk(*lost, chunk, nullptr, &bytes).ok());
    }
  }
  EXPECT_EQ(lost->AwaitInflightAtMost(0, absl::Now() + absl::Seconds(30)), 0u);
  lost->Cancel("the producer was lost");
  first.thread.join();
  ASSERT_EQ(progress->layers_rebuilt(), cut);

  // A producer that sends every layer again: refused before any chunk is taken.
  testing::SessionPeers second_peers = Connect("inproc");
  Receiving second;
  StartReceive(second_peers, expected_, progress, &cache, nullptr, &second);
  auto again = Open(second_peers, 0);
  second.thread.join();
  ASSERT_FALSE(second.result.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(second.result.status())) << second.result.status();
  EXPECT_THAT(std::string(second.result.status().message()),
              HasSubstr(absl::StrCat("sends layers from 0, this consumer has rebuilt layers [0, ",
                                     cut, ")")));
  EXPECT_FALSE(again->Finish().ok()) << "the producer hears the refusal";
}

TEST_F(TransferTakeoverTest, RestartDropsTheChunksHeldForALayerNotRebuilt) {
  KvCache cache = consumer_->NewCache(64);
  auto rebuilder = testing::Ok(LayerwiseRebuilder::Create(*decoder_, plan_, prefix_, &cache));
  auto filled = [](absl::StatusOr<std::vector<int>> f) { ASSERT_TRUE(f.ok()) << f.status(); };
  rebuilder->Begin(filled);
  const CodeBatch batch = testing::Ok(encoder_->Prefill(*producer_, prefix_));
  // The first layer after layer 0 that the plan sends in two chunks or more.
  int held_layer = -1;
  for (int l = 1; l < layers_ && held_layer < 0; ++l) {
    int chunks = 0;
    for (const PlannedChunk& p : expected_) chunks += p.layer == l;
    if (chunks >= 2) held_layer = l;
  }
  ASSERT_GT(held_layer, 0) << "the plan sends no layer in two chunks";
  // Every layer before it whole, and its first chunk (held: the layer waits for the rest).
  const CodeChunk* held = nullptr;
  for (const CodeChunk& chunk : batch.chunks) {
    if (chunk.layer < held_layer) rebuilder->Add(chunk, filled);
    if (chunk.layer == held_layer && held == nullptr) held = &chunk;
  }
  ASSERT_NE(held, nullptr);
  rebuilder->Add(*held, filled);
  ASSERT_EQ(rebuilder->layers_rebuilt(), held_layer);
  EXPECT_EQ(testing::Ok(rebuilder->Restart()), held_layer);
  // The held chunk comes again and is taken (not "a second copy"), then the rest completes.
  for (const CodeChunk& chunk : batch.chunks) {
    if (chunk.layer >= held_layer) rebuilder->Add(chunk, filled);
  }
  EXPECT_TRUE(rebuilder->Finish().ok()) << rebuilder->Finish();
  EXPECT_EQ(rebuilder->layers_rebuilt(), layers_);
}

}  // namespace
}  // namespace scd
