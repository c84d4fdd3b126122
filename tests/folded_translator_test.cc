// Folded reuse maps (per-head ranks, ReuseTranslator::FoldHeads): a folded code of any rank
// rebuilds what each head's own map rebuilds at that head's rank (checked against a float64
// reference built from the per-head maps, within the float32 bound of the folded GEMMs), lower
// ranks are prefixes bit for bit, the heads' ranks are counted from the column order, a
// frontier fit's column order follows the measured losses (GreedyHeadOrder against a hand
// count), and malformed folds are refused.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <vector>

#include "calib/frontier_fit.h"
#include "codec/gram_stats.h"
#include "codec/reuse_translator.h"
#include "tests/test_util.h"

namespace scd {
namespace {

constexpr int64_t kHeads = 3, kDim = 6, kRank = 4;

// Per-head maps of three different linear relations (B_h = A_h M_h + noise).
ReuseTranslator PerHeadMaps() {
  at::Generator gen = at::detail::createCPUGenerator(21);
  auto f64 = at::TensorOptions().dtype(at::kDouble);
  std::vector<GramStats> grams;
  for (int64_t h = 0; h < kHeads; ++h) {
    at::Tensor a = at::randn({800, kDim}, gen, f64) * at::pow(0.6, at::arange(kDim, f64)) + h;
    at::Tensor b = a.mm(at::randn({kDim, kDim}, gen, f64)) + 0.1 * at::randn({800, kDim}, gen, f64);
    GramStats g(kDim, kDim);
    g.Add(a, b);
    grams.push_back(g);
  }
  return testing::Ok(ReuseTranslator::Fit(grams, {FitMethod::kRrr, kRank, 0.99, 1e-4}));
}

// Each head's columns in their own order, interleaved unevenly.
const std::vector<int> kOrder = {0, 1, 2, 0, 0, 1, 2, 2, 1, 0, 1, 2};

TEST(FoldedTranslatorTest, AFoldedCodeIsEachHeadsCodeAtItsOwnRank) {
  const ReuseTranslator per_head = PerHeadMaps();
  const ReuseTranslator folded = testing::Ok(ReuseTranslator::FoldHeads(per_head, kOrder));
  ASSERT_TRUE(folded.folded());
  EXPECT_EQ(folded.rank(), kHeads * kRank);
  EXPECT_EQ(folded.dim_in(), kHeads * kDim);
  EXPECT_EQ(folded.CodeRows(kHeads), 1);
  EXPECT_EQ(per_head.CodeRows(kHeads), kHeads);

  at::Generator gen = at::detail::createCPUGenerator(22);
  const int64_t T = 37;
  const at::Tensor x = at::randn({kHeads, T, kDim}, gen) * 2 + 1;  // [heads, T, d]
  const at::Tensor z_full = folded.Encode(x, folded.rank());
  ASSERT_EQ(z_full.sizes(), (std::vector<int64_t>{1, T, kHeads * kRank}));
  // float32 bounds of the folded path against the exact result: an encode sums kHeads * kDim
  // products per code (the other heads' are exact zeros), a decode r products plus the bias.
  const at::Tensor xc =
      (x.transpose(0, 1).reshape({T, kHeads * kDim}) - folded.mu_a()).abs().to(at::kDouble);
  const at::Tensor enc_abs = folded.w_enc()[0].abs().to(at::kDouble);
  const at::Tensor dec_abs = folded.w_dec()[0].abs().to(at::kDouble);
  const at::Tensor mu_b_abs = folded.mu_b().abs().to(at::kDouble);
  const double tiny = 1e-30;
  for (int64_t r = 1; r <= folded.rank(); ++r) {
    // The heads' ranks are the first r columns' heads, counted.
    std::vector<int64_t> want(kHeads, 0);
    for (int64_t c = 0; c < r; ++c) ++want[kOrder[c]];
    const std::vector<int64_t> ranks = folded.HeadRanks(r, kHeads);
    ASSERT_EQ(ranks, want) << r;
    // Reference in float64 from the per-head maps, each head at its own rank.
    std::vector<at::Tensor> heads;
    for (int64_t h = 0; h < kHeads; ++h) {
      const at::Tensor enc = per_head.w_enc()[h].to(at::kDouble).narrow(1, 0, ranks[h]);
      const at::Tensor dec = per_head.w_dec()[h].to(at::kDouble).narrow(0, 0, ranks[h]);
      const at::Tensor xh = x[h].to(at::kDouble) - per_head.mu_a()[h].to(at::kDouble);
      heads.push_back(xh.mm(enc).mm(dec) + per_head.mu_b()[h].to(at::kDouble));
    }
    const at::Tensor reference = at::stack(heads);  // [heads, T, d]
    const at::Tensor z = folded.Encode(x, r);
    // Nested: a lower rank's code is the higher one's prefix, bit for bit.
    EXPECT_TRUE(at::equal(z, z_full.narrow(-1, 0, r).contiguous())) << r;
    const at::Tensor rebuilt = folded.Decode(z);
    ASSERT_EQ(rebuilt.sizes(), (std::vector<int64_t>{kHeads, T, kDim}));
    const at::Tensor code_bound =
        testing::Float32Gamma(kHeads * kDim) * xc.mm(enc_abs.narrow(1, 0, r)) + tiny;
    const at::Tensor dec_r = dec_abs.narrow(0, 0, r);
    const at::Tensor z_abs = z[0].abs().to(at::kDouble);
    const at::Tensor bound =
        code_bound.mm(dec_r) + testing::Float32Gamma(r + 1) * (z_abs.mm(dec_r) + mu_b_abs) + tiny;
    const at::Tensor bound_heads = bound.reshape({T, kHeads, kDim}).transpose(0, 1);
    EXPECT_LE(testing::MaxBoundRatio(rebuilt, reference, bound_heads), 1.0) << "rank " << r;
  }
  // At full rank it rebuilds what the per-head maps rebuild.
  EXPECT_LE(testing::MaxRelDiff(folded.Decode(z_full), per_head.Decode(per_head.Encode(x, kRank))),
            1e-4);
  // Truncated keeps the first columns' heads.
  const ReuseTranslator cut = folded.Truncated(5);
  EXPECT_EQ(cut.column_heads(), (std::vector<int>{0, 1, 2, 0, 0}));
  EXPECT_EQ(cut.HeadRanks(5, kHeads), (std::vector<int64_t>{3, 1, 1}));
}

TEST(FoldedTranslatorTest, MalformedFoldsAreRefused) {
  const ReuseTranslator per_head = PerHeadMaps();
  std::vector<int> short_order(kOrder.begin(), kOrder.end() - 1);
  EXPECT_FALSE(ReuseTranslator::FoldHeads(per_head, short_order).ok());
  std::vector<int> bad_head = kOrder;
  bad_head[3] = kHeads;
  EXPECT_FALSE(ReuseTranslator::FoldHeads(per_head, bad_head).ok());
  std::vector<int> head_twice = kOrder;  // the right count, but head 0 five times, head 1 three
  head_twice[1] = 0;
  EXPECT_FALSE(ReuseTranslator::FoldHeads(per_head, head_twice).ok());
  const ReuseTranslator folded = testing::Ok(ReuseTranslator::FoldHeads(per_head, kOrder));
  EXPECT_FALSE(ReuseTranslator::FoldHeads(folded, kOrder).ok());  // folds once
  // Stored tensors that mix heads are not a folded map.
  at::Tensor enc = folded.w_enc().clone();
  enc[0][0][1] = 0.5;  // head 0's input dim into column 1, head 1's
  auto mixed = ReuseTranslator::FromTensors(folded.mu_a(), folded.mu_b(), enc, folded.w_dec(),
                                            kOrder, kHeads);
  ASSERT_FALSE(mixed.ok());
  EXPECT_NE(std::string(mixed.status().message()).find("mixes heads"), std::string::npos);
  // Column heads that do not cover the rank, or a head count that does not split the dims.
  EXPECT_FALSE(ReuseTranslator::FromTensors(folded.mu_a(), folded.mu_b(), folded.w_enc(),
                                            folded.w_dec(), short_order, kHeads)
                   .ok());
  EXPECT_FALSE(ReuseTranslator::FromTensors(folded.mu_a(), folded.mu_b(), folded.w_enc(),
                                            folded.w_dec(), kOrder, 4)
                   .ok());
}

// Two heads, ladder 4 3 2 1. Head 0 loses 0.1 per column at every rung; head 1 0.01 for its
// first two rungs, then 0.48. Greedy removes head 1's two cheap rungs, head 0's three, then head
// 1's last; the order lists the kept columns first, then the removals backwards.
TEST(FoldedTranslatorTest, TheColumnOrderFollowsTheMeasuredLosses) {
  const std::vector<int64_t> ladder = {4, 3, 2, 1};
  const std::vector<std::vector<double>> loss = {{0, 0.1, 0.2, 0.3}, {0, 0.01, 0.02, 0.5}};
  EXPECT_EQ(GreedyHeadOrder(ladder, loss), (std::vector<int>{0, 1, 1, 0, 0, 0, 1, 1}));
  // Equal losses (binary fractions: exact differences): no head is lowered twice before the
  // other once (ties to the head with more columns left).
  const std::vector<std::vector<double>> flat = {{0, 0.125, 0.25, 0.375}, {0, 0.125, 0.25, 0.375}};
  const std::vector<int> order = GreedyHeadOrder(ladder, flat);
  ASSERT_EQ(order.size(), 8u);
  // Any prefix holds each head's columns within one of each other's count.
  std::vector<int> count(2, 0);
  for (int h : order) {
    ++count[static_cast<size_t>(h)];
    EXPECT_LE(std::abs(count[0] - count[1]), 1);
  }
}

}  // namespace
}  // namespace scd
