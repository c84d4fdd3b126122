// The runtime against ../shared/golden: float64-reference logits, 40 greedy tokens and per-layer
// captures (attention input, pre-RoPE keys, values) for every real checkpoint in shared/models.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "model/generator.h"
#include "model/llama_model.h"
#include "tests/test_util.h"

namespace scd {
namespace {

using testing::Golden;

class GoldenTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto model = LlamaModel::Load(testing::ModelDir(GetParam()), {});
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
    golden_ = testing::LoadGolden(GetParam());
    ASSERT_EQ(golden_.prompts.size(), 5u);
  }
  std::unique_ptr<LlamaModel> model_;
  Golden golden_;
};

TEST_P(GoldenTest, LogitsMatchReferenceForEveryPrompt) {
  for (size_t i = 0; i < golden_.prompts.size(); ++i) {
    const auto& ids = golden_.prompts[i].ids;
    KvCache cache = model_->NewCache(static_cast<int64_t>(ids.size()));
    auto out = model_->Forward(ids, &cache, {.logits = LogitsMode::kAll});
    ASSERT_TRUE(out.ok()) << out.status();
    at::Tensor expected = golden_.Tensor("p" + std::to_string(i) + ".logits");
    EXPECT_LE(testing::MaxAbsDiff(out->logits, expected), 2e-4) << "prompt " << i;
  }
}

TEST_P(GoldenTest, GreedyFortyTokensIdentical) {
  GenerationOptions options;
  options.max_tokens = 40;
  options.ignore_eos = true;
  for (size_t i = 0; i < golden_.prompts.size(); ++i) {
    const auto& prompt = golden_.prompts[i];
    KvCache cache = model_->NewCache(64);
    auto result = GenerateTokens(*model_, prompt.ids, &cache, options);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->output_ids, prompt.greedy_40) << "prompt " << i;
  }
}

TEST_P(GoldenTest, CapturedActivationsMatchReference) {
  const auto& ids = golden_.prompts[2].ids;
  CaptureSpec spec = CaptureSpec::All(model_->config());
  KvCache cache = model_->NewCache(static_cast<int64_t>(ids.size()));
  auto out = model_->Forward(ids, &cache, {.logits = LogitsMode::kNone, .capture = &spec});
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->captures.size(), static_cast<size_t>(model_->config().num_layers));
  for (const auto& [layer, capture] : out->captures) {
    const std::string prefix = "p2.layer" + std::to_string(layer) + ".";
    EXPECT_LE(testing::MaxAbsDiff(capture.attn_input, golden_.Tensor(prefix + "attn_input")), 1e-4)
        << prefix;
    EXPECT_LE(testing::MaxAbsDiff(capture.key_prerope, golden_.Tensor(prefix + "key_prerope")),
              1e-4)
        << prefix;
    EXPECT_LE(testing::MaxAbsDiff(capture.value, golden_.Tensor(prefix + "value")), 1e-4) << prefix;
  }
}

INSTANTIATE_TEST_SUITE_P(SharedModels, GoldenTest, ::testing::ValuesIn(testing::GoldenModelNames()),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (c == '-') c = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace scd
