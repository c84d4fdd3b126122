// LayerStepper: the last prompt token run layer by layer, each layer as soon as the cache's layer
// is filled, gives the logits and cache of LlamaModel::Forward on the finished cache bit for bit
// (real weights), waits for unfilled layers, and refuses what it cannot do.
#include "model/layer_stepper.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace scd {
namespace {

class LayerStepperTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto model = LlamaModel::Load(testing::ModelDir("stories260k"), {});
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = *std::move(model);
    prompt_ = testing::LoadGolden("stories260k").prompts[0].ids;
    ASSERT_GE(prompt_.size(), 4u);
    prefix_.assign(prompt_.begin(), prompt_.end() - 1);
  }
  int64_t Capacity() const { return static_cast<int64_t>(prompt_.size()) + 4; }
  // The reference: the prefix, then the last token by Forward.
  void Reference(KvCache* cache, at::Tensor* logits) {
    ASSERT_TRUE(model_->Forward(prefix_, cache, {.logits = LogitsMode::kNone}).ok());
    auto last = model_->Forward(absl::MakeConstSpan(prompt_).last(1), cache);
    ASSERT_TRUE(last.ok()) << last.status();
    *logits = last->logits;
  }

  std::unique_ptr<LlamaModel> model_;
  std::vector<TokenId> prompt_, prefix_;
};

// The prefix filled one layer at a time (as a rebuild fills it); the stepper follows each layer
// as soon as it is there and never runs ahead of the cache.
TEST_F(LayerStepperTest, FollowsLayersAsTheyFillAndEqualsForward) {
  KvCache want_cache = model_->NewCache(Capacity());
  at::Tensor want;
  Reference(&want_cache, &want);

  KvCache cache = model_->NewCache(Capacity());
  auto stepper = LayerStepper::Start(*model_, absl::MakeConstSpan(prompt_).last(1),
                                     static_cast<int64_t>(prefix_.size()));
  ASSERT_TRUE(stepper.ok()) << stepper.status();
  auto none = stepper->Advance(&cache);  // layer 0 holds nothing yet
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, 0);
  EXPECT_FALSE(stepper->LastLogits().ok());  // not through every layer
  auto hidden = model_->Embed(prefix_);
  ASSERT_TRUE(hidden.ok());
  at::Tensor h = *hidden;
  const int layers = static_cast<int>(model_->config().num_layers);
  for (int l = 0; l < layers; ++l) {
    auto next = model_->RunLayers(l, l + 1, h, &cache);
    ASSERT_TRUE(next.ok()) << next.status();
    h = *next;
    auto ran = stepper->Advance(&cache);
    ASSERT_TRUE(ran.ok()) << ran.status();
    EXPECT_EQ(*ran, 1) << "layer " << l;
    EXPECT_EQ(stepper->next_layer(), l + 1);
    EXPECT_EQ(cache.length(l), static_cast<int64_t>(prompt_.size()));
    if (l + 1 < layers) {
      EXPECT_EQ(cache.length(l + 1), 0);
    }
  }
  ASSERT_TRUE(stepper->done());
  auto logits = stepper->LastLogits();
  ASSERT_TRUE(logits.ok()) << logits.status();
  EXPECT_TRUE(at::equal(*logits, want)) << "max |diff| "
                                         << (*logits - want).abs().max().item<float>();
  testing::ExpectSameCache(cache, want_cache);
  EXPECT_GT(stepper->compute_time(), absl::ZeroDuration());
}

// Layers filled out of order (a later layer's codes first): nothing runs past the first gap.
TEST_F(LayerStepperTest, StopsAtTheFirstUnfilledLayer) {
  const int layers = static_cast<int>(model_->config().num_layers);
  ASSERT_GE(layers, 3);
  KvCache reference = model_->NewCache(Capacity());
  ASSERT_TRUE(model_->Forward(prefix_, &reference, {.logits = LogitsMode::kNone}).ok());
  KvCache cache = model_->NewCache(Capacity());
  auto stepper = LayerStepper::Start(*model_, absl::MakeConstSpan(prompt_).last(1),
                                     static_cast<int64_t>(prefix_.size()));
  ASSERT_TRUE(stepper.ok());
  auto copy = [&](int l) {
    ASSERT_TRUE(
        model_->LoadPrefix(l, reference.keys(l), reference.values(l), KeyFormat::kPostRope, &cache)
            .ok());
  };
  for (int l = 1; l < layers; ++l) copy(l);  // every layer but 0
  auto ran = stepper->Advance(&cache);
  ASSERT_TRUE(ran.ok());
  EXPECT_EQ(*ran, 0);
  copy(0);
  ran = stepper->Advance(&cache);
  ASSERT_TRUE(ran.ok());
  EXPECT_EQ(*ran, layers);  // everything else was waiting on layer 0
  EXPECT_TRUE(stepper->done());
}

TEST_F(LayerStepperTest, RefusesNoTokensAndPositionsPastTheModel) {
  EXPECT_FALSE(LayerStepper::Start(*model_, {}, 0).ok());
  const int64_t max = model_->config().max_position_embeddings;
  auto past = LayerStepper::Start(*model_, absl::MakeConstSpan(prompt_).last(1), max);
  ASSERT_FALSE(past.ok());
  EXPECT_EQ(past.status().code(), absl::StatusCode::kOutOfRange);
  auto ok = LayerStepper::Start(*model_, absl::MakeConstSpan(prompt_).last(1), 3);
  ASSERT_TRUE(ok.ok());
  ModelConfig deeper = model_->config();
  ++deeper.num_layers;
  KvCache wrong(deeper, 8, at::kFloat, at::kCPU);
  EXPECT_FALSE(ok->Advance(&wrong).ok());
}

}  // namespace
}  // namespace scd
