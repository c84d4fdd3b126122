// Sampling against analytic distributions: greedy = argmax, temperature = softmax(l / T),
// top-k and top-p truncate and renormalise exactly as defined, seeds reproduce.
#include "model/sampler.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace scd {
namespace {

std::vector<double> Frequencies(const SamplingParams& params, const at::Tensor& logits, int draws) {
  Sampler sampler(params);
  std::vector<double> counts(logits.numel(), 0.0);
  for (int i = 0; i < draws; ++i) counts[sampler.Sample(logits)] += 1.0 / draws;
  return counts;
}

const at::Tensor kLogits = at::tensor({1.0f, 3.0f, 2.0f, 0.5f, 3.0f - 1e-3f, -2.0f});

TEST(SamplerTest, GreedyIsFirstArgmax) {
  Sampler sampler({});
  EXPECT_EQ(sampler.Sample(kLogits), 1);
  EXPECT_EQ(sampler.Sample(at::tensor({2.0f, 5.0f, 5.0f})), 1);  // ties -> lowest index
  EXPECT_EQ(sampler.Sample(kLogits.unsqueeze(0)), 1);            // [1, V] accepted
}

TEST(SamplerTest, TemperatureMatchesSoftmax) {
  const float temperature = 0.7f;
  std::vector<double> freq = Frequencies({temperature, 0, 1.0f, 11}, kLogits, 40000);
  at::Tensor p = at::softmax(kLogits.to(at::kDouble) / temperature, 0);
  for (int i = 0; i < kLogits.numel(); ++i) {
    double expected = p[i].item<double>();
    // 5 standard errors of a binomial proportion.
    EXPECT_NEAR(freq[i], expected, 5 * std::sqrt(expected * (1 - expected) / 40000) + 1e-4) << i;
  }
}

TEST(SamplerTest, TopKKeepsOnlyTheKMostLikely) {
  std::vector<double> freq = Frequencies({1.0f, 2, 1.0f, 3}, kLogits, 20000);
  // Tokens 1 and 4 are the top two; their renormalised probabilities are e^3 : e^(3-1e-3).
  const double p1 = 1.0 / (1.0 + std::exp(-1e-3));
  EXPECT_NEAR(freq[1], p1, 0.02);
  EXPECT_NEAR(freq[4], 1 - p1, 0.02);
  EXPECT_EQ(freq[0] + freq[2] + freq[3] + freq[5], 0.0);
}

TEST(SamplerTest, TopPKeepsSmallestPrefixReachingTheMass) {
  at::Tensor logits = at::log(at::tensor({0.5f, 0.3f, 0.15f, 0.05f}));
  // Cumulative 0.5, 0.8, 0.95: top_p = 0.75 keeps {0, 1} renormalised to 0.625 / 0.375.
  std::vector<double> freq = Frequencies({1.0f, 0, 0.75f, 5}, logits, 20000);
  EXPECT_NEAR(freq[0], 0.625, 0.02);
  EXPECT_NEAR(freq[1], 0.375, 0.02);
  EXPECT_EQ(freq[2] + freq[3], 0.0);
  // A tiny top_p still keeps the most likely token.
  std::vector<double> one = Frequencies({1.0f, 0, 1e-6f, 5}, logits, 100);
  EXPECT_NEAR(one[0], 1.0, 1e-9);
}

TEST(SamplerTest, SameSeedSameSequenceDifferentSeedDifferent) {
  at::Tensor logits = at::zeros({1000});
  auto run = [&](uint64_t seed) {
    Sampler s({1.0f, 0, 1.0f, seed});
    std::vector<TokenId> out;
    for (int i = 0; i < 50; ++i) out.push_back(s.Sample(logits));
    return out;
  };
  EXPECT_EQ(run(1), run(1));
  EXPECT_NE(run(1), run(2));
}

TEST(SamplerTest, ValidateRejectsBadParameters) {
  EXPECT_FALSE((SamplingParams{-1.0f, 0, 1.0f, 0}).Validate().ok());
  EXPECT_FALSE((SamplingParams{NAN, 0, 1.0f, 0}).Validate().ok());
  EXPECT_FALSE((SamplingParams{1.0f, -3, 1.0f, 0}).Validate().ok());
  EXPECT_FALSE((SamplingParams{1.0f, 0, 0.0f, 0}).Validate().ok());
  EXPECT_FALSE((SamplingParams{1.0f, 0, 1.5f, 0}).Validate().ok());
  EXPECT_TRUE((SamplingParams{0.8f, 40, 0.9f, 0}).Validate().ok());
}

}  // namespace
}  // namespace scd
