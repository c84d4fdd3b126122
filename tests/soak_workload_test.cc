// The soak's workload (bench/soak_workload.h): the prompt pool's shared prefixes, the seeded
// request draw (deterministic, the mix's fractions, the rules of each kind), the comparison of a
// greedy stream with its reference, and the near-tie bound of a real model's config.
#include "bench/soak_workload.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <fstream>
#include <set>

#include "tests/test_files.h"

namespace scd::bench {
namespace {

TEST(SoakWorkloadTest, PromptsOfAGroupShareTheirPrefixAndNoOtherGroupsDoes) {
  testing::TempDir dir;
  {
    std::ofstream out(dir.File("lines.txt"));
    for (int i = 0; i < 20; ++i) out << "Line number " << i << " of the file.\n";
  }
  const std::vector<std::string> prompts = *SoakPrompts(dir.File("lines.txt"), 2, 3);
  ASSERT_EQ(prompts.size(), 6u);
  const std::string group0 = "Line number 0 of the file. Line number 1 of the file. Line number 2";
  const std::string group1 = "Line number 6 of the file. Line number 7";
  for (int i = 0; i < 3; ++i) EXPECT_EQ(prompts[i].rfind(group0, 0), 0u) << prompts[i];
  for (int i = 3; i < 6; ++i) EXPECT_EQ(prompts[i].rfind(group1, 0), 0u) << prompts[i];
  EXPECT_EQ(std::set<std::string>(prompts.begin(), prompts.end()).size(), 6u);
  EXPECT_EQ(SoakPrompts(dir.File("lines.txt"), 4, 5).status().code(),
            absl::StatusCode::kInvalidArgument);  // 32 lines needed
  EXPECT_FALSE(SoakPrompts(dir.File("missing.txt"), 1, 1).ok());
}

TEST(SoakWorkloadTest, TheDrawIsAFunctionOfItsSeedAndKeepsTheMix) {
  SoakMix mix;
  mix.targets = {"fables", "xs"};
  const SoakRequestSpec a = DrawSoakRequest(mix, 24, 7, 123), b = DrawSoakRequest(mix, 24, 7, 123);
  EXPECT_EQ(ToGenerateRequest(a, std::vector<std::string>(24, "p")).SerializeAsString(),
            ToGenerateRequest(b, std::vector<std::string>(24, "p")).SerializeAsString());
  const int n = 20000;
  int fanout = 0, sampled = 0, cancel = 0, abandon = 0, short_deadline = 0, forbid = 0,
      transfer = 0, slow = 0;
  std::set<std::string> modes, salts;
  for (int i = 0; i < n; ++i) {
    const SoakRequestSpec s = DrawSoakRequest(mix, 24, 7, i);
    ASSERT_LT(s.prompt, 24);
    modes.insert(s.mode);
    salts.insert(s.salt);
    fanout += s.targets.size() > 1;
    sampled += !s.greedy;
    cancel += s.action == ClientAction::kCancel;
    abandon += s.action == ClientAction::kAbandon;
    if (s.targets.size() > 1) {
      EXPECT_NE(s.mode, "local");  // a fan-out shares one prefill
    }
    if (s.mode == "local") {
      EXPECT_FALSE(s.forbid_fallback);
    } else {
      ++transfer;
      forbid += s.forbid_fallback;
    }
    EXPECT_GE(s.max_tokens, static_cast<uint32_t>(mix.min_tokens));
    EXPECT_LE(s.max_tokens, static_cast<uint32_t>(mix.max_tokens));
    if (s.read_pace > absl::ZeroDuration()) {
      ++slow;
      EXPECT_EQ(s.action, ClientAction::kNone);  // a slow reader reads to the end
      EXPECT_FALSE(s.short_deadline);
      EXPECT_GE(s.read_pace, mix.min_read_pace);
      EXPECT_LE(s.read_pace, mix.max_read_pace);
    }
    if (s.short_deadline) {
      ++short_deadline;
      EXPECT_GE(s.deadline_ms, 50u);
      EXPECT_LE(s.deadline_ms, 400u);
    } else {
      EXPECT_EQ(s.deadline_ms, mix.deadline_ms);
    }
  }
  // Binomial fractions: 5 standard deviations of 20,000 draws is under 1.3 points.
  auto near = [&](int count, double p) { EXPECT_NEAR(count / double(n), p, 0.013) << p; };
  near(fanout, mix.fanout);
  near(sampled, mix.sampled);
  near(cancel, mix.cancel);
  near(abandon, mix.abandon);
  near(short_deadline, mix.short_deadline);
  near(slow, mix.slow_read);
  // Of ~17,000 transfer requests: 5 standard deviations is under 1.2 points.
  EXPECT_NEAR(forbid / double(transfer), mix.forbid_fallback, 0.012);
  EXPECT_EQ(modes, (std::set<std::string>{"local", "raw", "scd", "auto"}));
  EXPECT_EQ(salts, (std::set<std::string>{"", "tenant-a", "tenant-b"}));
}

TEST(SoakWorkloadTest, AGreedyStreamMatchesItsReferenceOrPartsOnlyAtANearTie) {
  SoakReference ref;
  ref.ids = {5, 6, 7, 8};
  ref.gaps = {1.0, 0.001, 2.0, 3.0};
  ref.reason = "length";
  EXPECT_TRUE(CompareWithReference({5, 6, 7, 8}, "length", ref, 0.01).ok);
  EXPECT_TRUE(CompareWithReference({5, 6}, "length", ref, 0.01).ok);  // a smaller max_tokens
  TokenVerdict v = CompareWithReference({5, 9, 1}, "length", ref, 0.01);
  EXPECT_TRUE(v.ok);  // parted at token 1, whose top two were 0.001 apart
  EXPECT_TRUE(v.near_tie);
  EXPECT_EQ(v.parted_at, 1);
  v = CompareWithReference({5, 6, 9}, "length", ref, 0.01);
  EXPECT_FALSE(v.ok);
  EXPECT_EQ(v.parted_at, 2);
  EXPECT_NE(v.why.find("token 2 is 9, the reference's 7"), std::string::npos) << v.why;
  EXPECT_FALSE(CompareWithReference({5, 6}, "stop", ref, 0.01).ok);  // an EOS it did not have
  ref.reason = "stop";
  EXPECT_FALSE(CompareWithReference({5, 6, 7, 8, 2}, "length", ref, 0.01).ok);  // past its EOS
  EXPECT_TRUE(CompareWithReference({5, 6, 7, 8}, "stop", ref, 0.01).ok);
}

TEST(SoakWorkloadTest, TheNearTieBoundFollowsTheModelsShape) {
  // stories260k: hidden 64, intermediate 172, 5 layers.
  EXPECT_DOUBLE_EQ(*NearTieBound(testing::ModelDir("stories260k")), 50 * FLT_EPSILON * 172 * 5);
  EXPECT_FALSE(NearTieBound("/nonexistent").ok());
}

}  // namespace
}  // namespace scd::bench
