// 8- and 16-bit weights keep quality (issue 48): every real checkpoint loaded with int8, bf16 and
// f16 weights (model/packed_weight.h) has a perplexity on TinyStories valid (32 sequences of 256
// tokens, ../shared/data/tinystories_valid_hf.txt) within 1 % of its float32 perplexity; the
// greedy continuations of each precision are compared with float32's and reported (16 held-out
// openers x 32 tokens), as is the consumer precision's effect on the hard pairs' scd fidelity
// (tests/calib_pair_test.cc holds that bound).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "calib/perplexity.h"
#include "calib/text_corpus.h"
#include "model/llama_model.h"
#include "tests/test_util.h"
#include "tokenizer/tokenizer.h"

namespace scd {
namespace {

std::vector<std::string> Openers(int count) {
  std::ifstream in(testing::SharedDir() + "/data/tinystories_valid_openers.txt");
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) lines.push_back(line);
  }
  std::vector<std::string> picked;
  for (size_t i = 7; i < lines.size() && static_cast<int>(picked.size()) < count; i += 47) {
    picked.push_back(lines[i]);
  }
  return picked;
}

class PrecisionQualityTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PrecisionQualityTest, PerplexityWithinOnePercentOfFloat32) {
  const std::string name = GetParam(), dir = testing::ModelDir(name);
  const auto tokenizer = testing::Ok(Tokenizer::FromFile(dir + "/tokenizer.json"));
  const TextCorpus corpus = testing::Ok(
      TextCorpus::Load(testing::SharedDir() + "/data/tinystories_valid_hf.txt", *tokenizer));
  const auto sequences = testing::Ok(corpus.Sequences(32, 256));
  std::vector<std::vector<TokenId>> prompts;
  for (const std::string& text : Openers(16))
    prompts.push_back(testing::Ok(tokenizer->Encode(text)));

  const auto f32 = testing::Ok(LlamaModel::Load(dir, {}));
  const PerplexityResult base = testing::Ok(Perplexity(*f32, sequences));
  const auto base_greedy = testing::Ok(GreedyContinuations(*f32, prompts, 32));
  std::printf("%-22s f32   ppl %.4f (%lld tokens)\n", name.c_str(), base.ppl,
              static_cast<long long>(base.tokens));
  for (const WeightFormat format : {WeightFormat::kInt8, WeightFormat::kBF16, WeightFormat::kF16}) {
    LlamaModel::Options options;
    options.weights = format;
    const auto model = testing::Ok(LlamaModel::Load(dir, options));
    const PerplexityResult r = testing::Ok(Perplexity(*model, sequences));
    const GreedyAgreement g =
        CompareGreedy(base_greedy, testing::Ok(GreedyContinuations(*model, prompts, 32)));
    std::printf(
        "%-22s %-5s ppl %.4f (%+.3f %%), greedy tokens equal to f32's: %.1f %% of "
        "positions, %d of %d prompts throughout\n",
        name.c_str(), WeightFormatName(format), r.ppl, 100 * (r.ppl / base.ppl - 1),
        100 * g.positions, g.identical, g.prompts);
    EXPECT_NEAR(r.ppl / base.ppl, 1.0, 0.01) << name << " " << WeightFormatName(format);
  }
}

INSTANTIATE_TEST_SUITE_P(RealCheckpoints, PrecisionQualityTest,
                         ::testing::Values("stories260k", "stories260k-fables", "llama2xs-260k",
                                           "tinystories-4m", "tinystories-4m-fables",
                                           "tinystories-4m-b", "tinystories-656k"),
                         [](const auto& info) { return testing::TestNameOf(info.param); });

}  // namespace
}  // namespace scd
