// Sampling against analytic distributions: greedy = argmax, temperature = softmax(l / T),
// top-k and top-p truncate and renormalise exactly as defined, seeds reproduce; the draws are
// Philox4x32-10 (Random123's known-answer vectors) keyed by (seed, position).
#include "model/sampler.h"

#include <ATen/ATen.h>
#include <ATen/core/PhiloxRNGEngine.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

namespace scd {
namespace {

std::vector<double> Frequencies(const SamplingParams& params, const at::Tensor& logits, int draws) {
  Sampler sampler(params);
  std::vector<double> counts(logits.numel(), 0.0);
  for (int i = 0; i < draws; ++i) counts[sampler.Sample(logits, i)] += 1.0 / draws;
  return counts;
}

const at::Tensor kLogits = at::tensor({1.0f, 3.0f, 2.0f, 0.5f, 3.0f - 1e-3f, -2.0f});

TEST(SamplerTest, GreedyIsFirstArgmax) {
  Sampler sampler({});
  EXPECT_EQ(sampler.Sample(kLogits, 0), 1);
  EXPECT_EQ(sampler.Sample(at::tensor({2.0f, 5.0f, 5.0f}), 1), 1);  // ties -> lowest index
  EXPECT_EQ(sampler.Sample(kLogits.unsqueeze(0), 2), 1);            // [1, V] accepted
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
    for (int i = 0; i < 50; ++i) out.push_back(s.Sample(logits, i));
    return out;
  };
  EXPECT_EQ(run(1), run(1));
  EXPECT_NE(run(1), run(2));
}

// Random123's known-answer vectors for Philox4x32-10 (kat_vectors: counter[4] key[2] ->
// output[4]), through ATen's engine with key = seed, counter = (offset, subsequence).
TEST(SamplerTest, PhiloxMatchesRandom123KnownAnswers) {
  struct Kat {
    std::array<uint32_t, 4> counter;
    std::array<uint32_t, 2> key;
    std::array<uint32_t, 4> out;
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  auto join = [](uint32_t low, uint32_t high) { return (uint64_t{high} << 32) | low; };
  for (const Kat& kat : kats) {
    at::Philox4_32 engine(join(kat.key[0], kat.key[1]), join(kat.counter[2], kat.counter[3]),
                          join(kat.counter[0], kat.counter[1]));
    for (uint32_t word : kat.out) EXPECT_EQ(engine(), word);
  }
  // Sampler::Uniform is the first two words of the block at counter (0, 0, position).
  const uint64_t bits = ((uint64_t{0x6627e8d5} << 32) | 0xe169c58d) >> 11;
  EXPECT_EQ(Sampler::Uniform(0, 0), static_cast<double>(bits) * 0x1.0p-53);
}

// What a moved stream relies on: the token at a position is the same whether the sampler drew
// every position before it, started there, or drew them in another order.
TEST(SamplerTest, ATokenDependsOnlyOnSeedPositionAndLogits) {
  const at::Tensor logits = at::sin(at::arange(500, at::kFloat) * 0.37) * 3;
  const SamplingParams params{0.8f, 0, 0.9f, 1234};
  Sampler unmoved(params);
  std::vector<TokenId> all;
  for (int64_t p = 0; p < 64; ++p) all.push_back(unmoved.Sample(logits, 100 + p));
  Sampler moved(params);
  for (int64_t p = 63; p >= 20; --p) EXPECT_EQ(moved.Sample(logits, 100 + p), all[p]) << p;
  // And it moves with the position: 64 draws from ~dozens of kept tokens are not all one token.
  EXPECT_GT(std::count(all.begin(), all.end(), all[0]), 0);
  EXPECT_LT(std::count(all.begin(), all.end(), all[0]), 64);
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
