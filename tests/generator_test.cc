// Generation loops: stop strings (held back while they might still match), streaming text equal
// to the final text, and stop strings cutting a real model's output exactly where an unstopped
// run of the same seed shows them.
#include "model/generator.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <set>
#include <tuple>

#include "tests/test_util.h"
#include "tokenizer/tokenizer.h"

namespace scd {
namespace {

struct Collected {
  std::vector<std::string> pieces;
  std::string All() const {
    std::string s;
    for (const auto& p : pieces) s += p;
    return s;
  }
  TextCallback Callback() {
    return [this](std::string_view piece) { pieces.emplace_back(piece); };
  }
};

TEST(StopStringMatcherTest, StopsAtTheMatchAndNeverShowsPartOfIt) {
  StopStringMatcher matcher({"<|end_story|>"});
  Collected out;
  EXPECT_FALSE(matcher.Add("ab", out.Callback()));
  EXPECT_FALSE(matcher.Add("c<|e", out.Callback()));
  EXPECT_EQ(out.All(), "abc");  // "<|e" could still become the stop string
  EXPECT_FALSE(matcher.Add("nd", out.Callback()));
  EXPECT_TRUE(matcher.Add("_story|>tail", out.Callback()));
  EXPECT_EQ(out.All(), "abc");
}

TEST(StopStringMatcherTest, ReleasesHeldTextWhenItStopsMatching) {
  StopStringMatcher matcher({"STOP"});
  Collected out;
  EXPECT_FALSE(matcher.Add("xST", out.Callback()));
  EXPECT_EQ(out.All(), "x");
  EXPECT_FALSE(matcher.Add("x", out.Callback()));
  EXPECT_EQ(out.All(), "xSTx");
  EXPECT_FALSE(matcher.Add("S", out.Callback()));
  matcher.Finish(out.Callback());
  EXPECT_EQ(out.All(), "xSTxS");
}

TEST(StopStringMatcherTest, EarliestOfSeveralStopsWins) {
  StopStringMatcher matcher({"bb", "a b", ""});  // empty stop strings are ignored
  Collected out;
  EXPECT_TRUE(matcher.Add("1 a bb", out.Callback()));
  EXPECT_EQ(out.All(), "1 ");
  StopStringMatcher none({});
  Collected all;
  EXPECT_FALSE(none.Add("anything", all.Callback()));
  EXPECT_EQ(all.All(), "anything");
}

TEST(GenerateTextTest, StreamedPiecesEqualTextAndStopStringsCutIt) {
  auto model = LlamaModel::Load(testing::ModelDir("stories260k"), {});
  ASSERT_TRUE(model.ok());
  auto tokenizer = Tokenizer::FromFile(testing::ModelDir("stories260k") + "/tokenizer.json");
  ASSERT_TRUE(tokenizer.ok());
  GenerationOptions options;
  options.max_tokens = 120;
  options.sampling = {0.9f, 0, 1.0f, 17};
  options.ignore_eos = true;
  Collected streamed;
  auto full = GenerateText(**model, **tokenizer, "Once upon a time", options, streamed.Callback());
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ(streamed.All(), full->text);
  EXPECT_EQ(FinishReasonName(full->finish_reason), "length");
  // Pick a stop string from the middle of the unstopped output.
  const size_t at = full->text.find(' ', full->text.size() / 2);
  ASSERT_NE(at, std::string::npos);
  const std::string stop = full->text.substr(at, 6);
  options.stop_strings = {stop};
  Collected cut;
  auto stopped = GenerateText(**model, **tokenizer, "Once upon a time", options, cut.Callback());
  ASSERT_TRUE(stopped.ok());
  EXPECT_EQ(stopped->text, full->text.substr(0, full->text.find(stop)));
  EXPECT_EQ(cut.All(), stopped->text);
  EXPECT_EQ(FinishReasonName(stopped->finish_reason), "stop");
  EXPECT_LT(stopped->output_ids.size(), full->output_ids.size());
}

// LogprobsOf against an independent reference: at::log_softmax in float64.
TEST(LogprobsTest, MatchesLogSoftmaxInDoubleAndRanksTies) {
  at::manual_seed(5);
  at::Tensor logits = (at::randn({1, 300}, at::TensorOptions().dtype(at::kFloat)) * 4).clamp(-12, 12);
  logits = logits.contiguous();
  logits.data_ptr<float>()[7] = 13.5f;
  logits.data_ptr<float>()[3] = 13.5f;  // a tie with id 7 above every other: the lower id first
  const TokenLogprobs lp = LogprobsOf(logits, 42, 5);
  const at::Tensor ref = at::log_softmax(logits.to(at::kDouble).reshape({-1}), 0);
  ASSERT_EQ(lp.top.size(), 5u);
  EXPECT_EQ(lp.top[0].id, 3);
  EXPECT_EQ(lp.top[1].id, 7);
  EXPECT_EQ(lp.top[0].logprob, lp.top[1].logprob);
  // float32 logits: log p = x - logZ, rounded once to float (|log p| < 64 here).
  EXPECT_NEAR(lp.logprob, ref[42].item<double>(), 1e-5);
  for (size_t i = 0; i < lp.top.size(); ++i) {
    EXPECT_NEAR(lp.top[i].logprob, ref[lp.top[i].id].item<double>(), 1e-5);
    if (i > 0) {
      EXPECT_LE(lp.top[i].logprob, lp.top[i - 1].logprob);
    }
  }
  // The top 5 are the 5 largest of the reference.
  const at::Tensor top5 = std::get<1>(ref.topk(5));
  std::set<int64_t> want, got;
  for (int i = 0; i < 5; ++i) want.insert(top5[i].item<int64_t>());
  for (const TopLogprob& t : lp.top) got.insert(t.id);
  EXPECT_EQ(got, want);
}

// Greedy generation: the top-1 candidate is the generated token at every position, and its
// log-probability is the token's own.
TEST(LogprobsTest, TopOneIsTheGreedyTokenAtEveryPosition) {
  auto model = LlamaModel::Load(testing::ModelDir("stories260k"), {});
  ASSERT_TRUE(model.ok());
  const std::vector<TokenId> prompt = testing::LoadGolden("stories260k").prompts[0].ids;
  GenerationOptions options;
  options.max_tokens = 24;
  options.ignore_eos = true;
  options.top_logprobs = 3;
  KvCache cache = (*model)->NewCache(static_cast<int64_t>(prompt.size()) + 24);
  std::vector<TokenLogprobs> seen;
  auto result = GenerateTokensWithLogprobs(**model, prompt, &cache, options,
                                           [&](TokenId id, const TokenLogprobs& lp) {
                                             EXPECT_EQ(lp.id, id);
                                             seen.push_back(lp);
                                             return true;
                                           });
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(seen.size(), result->output_ids.size());
  ASSERT_EQ(seen.size(), 24u);
  for (size_t i = 0; i < seen.size(); ++i) {
    ASSERT_EQ(seen[i].top.size(), 3u);
    EXPECT_EQ(seen[i].top[0].id, result->output_ids[i]) << "position " << i;
    EXPECT_EQ(seen[i].top[0].logprob, seen[i].logprob);
    EXPECT_LE(seen[i].logprob, 0.0f);
  }
  // Without top_logprobs the same run gives the same tokens (logprobs are observation only).
  KvCache plain_cache = (*model)->NewCache(static_cast<int64_t>(prompt.size()) + 24);
  options.top_logprobs = 0;
  auto plain = GenerateTokens(**model, prompt, &plain_cache, options);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->output_ids, result->output_ids);
}

}  // namespace
}  // namespace scd
