// LayerwiseRebuilder against the batch decoder (an independent path through the same math): chunks
// fed one at a time, in a shuffled order, leave the cache CodeDecoder::Decode builds from the
// whole batch, bit for bit, in every mode that sends codes; each layer is rebuilt the moment its
// last chunk arrives; bad, repeated and missing chunks are named.
#include "codec/layerwise_rebuilder.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "codec/code_encoder.h"
#include "tests/test_util.h"

namespace scd {
namespace {

using ::testing::HasSubstr;

// What a rebuilder's call told its `done`, under the default pacing (inline: before it returns).
absl::StatusOr<std::vector<int>> Told(const std::function<void(LayerwiseRebuilder::Filled)>& call) {
  std::optional<absl::StatusOr<std::vector<int>>> told;
  call([&told](absl::StatusOr<std::vector<int>> filled) { told = std::move(filled); });
  if (!told.has_value()) return absl::InternalError("done was not called before the call returned");
  return *std::move(told);
}
absl::StatusOr<std::vector<int>> Add(LayerwiseRebuilder& rebuilder, const CodeChunk& chunk) {
  return Told([&](LayerwiseRebuilder::Filled done) { rebuilder.Add(chunk, std::move(done)); });
}
absl::StatusOr<std::vector<int>> Begin(LayerwiseRebuilder& rebuilder) {
  return Told([&](LayerwiseRebuilder::Filled done) { rebuilder.Begin(std::move(done)); });
}

class LayerwiseRebuilderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = testing::Ok(LlamaModel::Load(testing::ModelDir("stories260k"), {}));
    artifact_ = testing::SyntheticArtifact(*model_);
    prefix_ = testing::LoadGolden("stories260k").prompts[2].ids;
  }
  TransferPlan Plan(TransferMode mode) {
    options_.recompute_layers = {2, 3};
    return testing::Ok(TransferPlan::Make(
        mode, model_->config(), ModeNeedsArtifact(mode) ? &artifact_ : nullptr, options_));
  }
  CodeBatch Batch(const TransferPlan& plan) {
    const Artifact* used = ModeNeedsArtifact(plan.mode) ? &artifact_ : nullptr;
    return testing::Ok(CodeEncoder(plan, used, options_).Prefill(*model_, prefix_));
  }

  std::unique_ptr<LlamaModel> model_;
  Artifact artifact_;
  std::vector<TokenId> prefix_;
  TransferOptions options_;
};

TEST_F(LayerwiseRebuilderTest, ShuffledChunksRebuildTheBatchDecodersCacheBitForBit) {
  const int layers = model_->config().num_layers;
  std::mt19937 shuffle(7);
  for (TransferMode mode : {TransferMode::kRaw, TransferMode::kInt4, TransferMode::kRecompute,
                            TransferMode::kReuse, TransferMode::kScd}) {
    SCOPED_TRACE(TransferModeName(mode));
    const TransferPlan plan = Plan(mode);
    CodeBatch batch = Batch(plan);
    const Artifact* used = ModeNeedsArtifact(mode) ? &artifact_ : nullptr;
    CodeDecoder decoder(*model_, used);
    KvCache reference = model_->NewCache(64);
    ASSERT_TRUE(decoder.Decode(batch, prefix_, &reference).ok());

    KvCache cache = model_->NewCache(64);
    auto rebuilder = testing::Ok(LayerwiseRebuilder::Create(decoder, plan, prefix_, &cache));
    std::shuffle(batch.chunks.begin(), batch.chunks.end(), shuffle);
    // Recomputing from layer 0 needs no chunk: Begin; everything else through Add.
    int rebuilt = static_cast<int>(testing::Ok(Begin(*rebuilder)).size());
    for (size_t i = 0; i < batch.chunks.size(); ++i) {
      const int layer = batch.chunks[i].layer;
      // Is this the layer's last chunk still to come?
      const bool last = std::none_of(batch.chunks.begin() + i + 1, batch.chunks.end(),
                                     [&](const CodeChunk& c) { return c.layer == layer; });
      std::vector<int> filled = testing::Ok(Add(*rebuilder, batch.chunks[i]));
      EXPECT_EQ(!filled.empty(), last) << "layer " << layer;
      for (int l : filled) EXPECT_EQ(cache.length(l), static_cast<int64_t>(prefix_.size()));
      rebuilt += static_cast<int>(filled.size());
    }
    EXPECT_TRUE(rebuilder->complete());
    EXPECT_TRUE(rebuilder->Finish().ok());
    EXPECT_EQ(rebuilt, layers);
    for (int l = 0; l < layers; ++l) {
      EXPECT_TRUE(at::equal(cache.keys(l), reference.keys(l))) << "layer " << l;
      EXPECT_TRUE(at::equal(cache.values(l), reference.values(l))) << "layer " << l;
    }
  }
}

TEST_F(LayerwiseRebuilderTest, RefusesWhatThePlanDoesNotSendAndNamesWhatIsMissing) {
  const TransferPlan plan = Plan(TransferMode::kRaw);
  CodeBatch batch = Batch(plan);
  CodeDecoder decoder(*model_, nullptr);
  KvCache cache = model_->NewCache(64);
  auto rebuilder = testing::Ok(LayerwiseRebuilder::Create(decoder, plan, prefix_, &cache));
  ASSERT_TRUE(Begin(*rebuilder).ok());
  ASSERT_TRUE(Add(*rebuilder, batch.chunks[0]).ok());
  absl::Status again = Add(*rebuilder, batch.chunks[0]).status();
  EXPECT_EQ(again.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(again.message()), HasSubstr("second copy"));

  CodeChunk foreign = batch.chunks[1];
  foreign.kind = PayloadKind::kHiddenCode;
  absl::Status unplanned = Add(*rebuilder, foreign).status();
  EXPECT_THAT(std::string(unplanned.message()), HasSubstr("plan sends no"));
  CodeChunk outside = batch.chunks[1];
  outside.layer = 99;
  EXPECT_EQ(Add(*rebuilder, outside).status().code(), absl::StatusCode::kInvalidArgument);
  CodeChunk partial = batch.chunks[1];
  partial.token_end = 1;
  EXPECT_EQ(Add(*rebuilder, partial).status().code(), absl::StatusCode::kInvalidArgument);

  // Stopping after half the chunks: not complete, and Finish names a missing chunk.
  for (size_t i = 1; i < batch.chunks.size() / 2; ++i)
    ASSERT_TRUE(Add(*rebuilder, batch.chunks[i]).ok());
  EXPECT_FALSE(rebuilder->complete());
  absl::Status finish = rebuilder->Finish();
  EXPECT_EQ(finish.code(), absl::StatusCode::kFailedPrecondition);
  const CodeChunk& never = batch.chunks.back();
  EXPECT_THAT(std::string(finish.message()),
              HasSubstr(PayloadKindName(never.kind) + " of layer " + std::to_string(never.layer)));

  // A non-empty cache is refused.
  EXPECT_EQ(LayerwiseRebuilder::Create(decoder, plan, prefix_, &cache).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// Paced by a runner that defers the work (as the consumer's scheduler does: pieces between decode
// steps, no thread waiting): a layer's chunk is told done only after its pieces ran, the layer is
// untouched until then, and the cache is the batch decoder's bit for bit (one piece each).
TEST_F(LayerwiseRebuilderTest, DeferredPiecesTellTheirLayerOnlyOnceTheyRan) {
  const TransferPlan plan = Plan(TransferMode::kScd);
  CodeBatch batch = Batch(plan);
  CodeDecoder decoder(*model_, &artifact_);
  KvCache reference = model_->NewCache(64);
  ASSERT_TRUE(decoder.Decode(batch, prefix_, &reference).ok());

  struct Deferred {
    int64_t rows;
    RebuildPacing::Piece work;
    RebuildPacing::Done done;
  };
  std::vector<Deferred> waiting;
  RebuildPacing pacing;
  pacing.run = [&waiting](int64_t rows, int, RebuildPacing::Piece work, RebuildPacing::Done done) {
    waiting.push_back({rows, std::move(work), std::move(done)});
  };
  KvCache cache = model_->NewCache(64);
  auto rebuilder =
      testing::Ok(LayerwiseRebuilder::Create(decoder, plan, prefix_, &cache, 0, pacing));
  std::optional<absl::StatusOr<std::vector<int>>> told;
  auto tell = [&told](absl::StatusOr<std::vector<int>> filled) { told = std::move(filled); };
  rebuilder->Begin(tell);
  ASSERT_TRUE(told.has_value() && told->ok() && (*told)->empty());  // scd recomputes no layer 0
  size_t ran = 0;
  for (const CodeChunk& chunk : batch.chunks) {
    told.reset();
    rebuilder->Add(chunk, tell);
    if (waiting.empty()) {  // the layer waits for more chunks
      ASSERT_TRUE(told.has_value() && told->ok() && (*told)->empty());
      continue;
    }
    ASSERT_EQ(waiting.size(), 1u);
    EXPECT_FALSE(told.has_value()) << "told before its pieces ran (layer " << chunk.layer << ")";
    EXPECT_EQ(cache.length(chunk.layer), 0) << "layer " << chunk.layer;
    Deferred piece = std::move(waiting.back());
    waiting.clear();
    piece.done(piece.work(0, piece.rows));
    ASSERT_TRUE(told.has_value() && told->ok());
    ASSERT_FALSE((*told)->empty());
    EXPECT_EQ((*told)->front(), chunk.layer);  // the layer, and a recomputed run it starts
    ran += (*told)->size();
  }
  EXPECT_EQ(ran, static_cast<size_t>(model_->config().num_layers));
  ASSERT_TRUE(rebuilder->Finish().ok());
  for (int l = 0; l < model_->config().num_layers; ++l) {
    EXPECT_TRUE(at::equal(cache.keys(l), reference.keys(l))) << "layer " << l;
    EXPECT_TRUE(at::equal(cache.values(l), reference.values(l))) << "layer " << l;
  }
}

}  // namespace
}  // namespace scd
