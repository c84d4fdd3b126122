// Generation loops: stop strings (held back while they might still match), streaming text equal
// to the final text, and stop strings cutting a real model's output exactly where an unstopped
// run of the same seed shows them.
#include "model/generator.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

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
  EXPECT_EQ(full->finish_reason, "length");
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
  EXPECT_EQ(stopped->finish_reason, "stop");
  EXPECT_LT(stopped->output_ids.size(), full->output_ids.size());
}

}  // namespace
}  // namespace scd
