// Calibration building blocks: the layer policy on scores with known structure, aligner training
// on a problem a linear map cannot solve, corpus windows, the fidelity evaluator's oracle
// identity, and the SVG writer.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "calib/aligner_trainer.h"
#include "calib/fidelity.h"
#include "calib/layer_policy.h"
#include "calib/report_json.h"
#include "calib/text_corpus.h"
#include "tests/test_util.h"

namespace scd {
namespace {

TEST(LayerPolicyTest, RestoreOneGreedyAndEfficientBudget) {
  // Layer gains 0.5, 0.1, 0.3, 0.05, 0.2; layers 2 and 4 are redundant with each other (restoring
  // both gains only 0.3), so greedy must prefer 0 -> 2 -> 1 over the restore-one order.
  const std::vector<double> gain = {0.5, 0.1, 0.3, 0.05, 0.2};
  int calls = 0;
  auto score = [&](const std::vector<int>& s) -> absl::StatusOr<double> {
    ++calls;
    std::set<int> set(s.begin(), s.end());
    double f = -1.0;
    for (int l : set) f += gain[l];
    if (set.count(2) && set.count(4)) f -= 0.2;
    return f;
  };
  LayerPolicyOptions options;
  options.k_min = 1;
  options.k_max = 4;
  auto r = SelectLayers(5, score, options);
  ASSERT_TRUE(r.ok());
  EXPECT_DOUBLE_EQ(r->base, -1.0);
  EXPECT_NEAR(r->restore_one[2], 0.3, 1e-12);
  EXPECT_EQ(r->pool, (std::vector<int>{0, 2, 4, 1, 3}));
  EXPECT_EQ(r->greedy_order, (std::vector<int>{0, 2, 1, 3}));
  // Gains 0.5, 0.8, 0.9, 0.95: per layer 0.5, 0.4, 0.3, 0.2375 -> k* = 1.
  EXPECT_EQ(r->k, 1);
  EXPECT_EQ(r->chosen, (std::vector<int>{0}));
  EXPECT_EQ(calls, 1 + 5 + (5 + 4 + 3 + 2));
  options.fixed_k = 3;
  auto fixed = SelectLayers(5, score, options);
  EXPECT_EQ(fixed->chosen, (std::vector<int>{0, 1, 2}));
  options.fixed_k = -1;
  EXPECT_TRUE(SelectLayers(5, score, options)->chosen.empty());
  // A higher per-layer cost leaves the argmax where it is; k_min forces more layers.
  options.fixed_k = 0;
  options.k_min = 2;
  EXPECT_EQ(SelectLayers(5, score, options)->k, 2);
}

// A small aligner on the hidden-state loss, trained to a fixed epoch count (no time budget).
AlignerTrainOptions SmallAlignerOptions(int epochs) {
  AlignerTrainOptions options;
  options.shape = {64, 2};
  options.loss = AlignerTrainOptions::Loss::kHidden;
  options.max_epochs = epochs;
  options.batch = 256;
  options.max_seconds = 0;
  options.seed = 1;
  return options;
}

TEST(AlignerTrainerTest, LearnsWhatTheLinearDecodeCannot) {
  // H_B = H_A + 0.5 * tanh(3 * H_A[:, 0]) on one axis: the MLP must take most of that residual.
  at::Generator gen = at::detail::createCPUGenerator(3);
  const int64_t n = 6000, d = 8;
  at::Tensor a = at::randn({n, d}, gen);
  at::Tensor b = a.clone();
  b.select(1, 3) += 0.5 * at::tanh(3 * a.select(1, 0)) * a.select(1, 1);
  GramStats g(d, d);
  g.Add(a, b);
  auto basis = ReuseTranslator::Fit({g}, {FitMethod::kRrr, d, 0.99, 1e-6});
  ASSERT_TRUE(basis.ok());
  const AlignerTrainOptions options = SmallAlignerOptions(40);
  AlignerTrainReport report;
  int epochs_seen = 0;
  auto aligner = TrainAligner(*basis, a, b, at::Tensor(), options, &report,
                              [&](int, double) { ++epochs_seen; });
  ASSERT_TRUE(aligner.ok()) << aligner.status();
  EXPECT_EQ(epochs_seen, report.epochs);
  EXPECT_LT(report.heldout, 0.3 * report.linear_heldout) << ToJson(report).dump();
  // The trained aligner, applied through the codec's own inference code, agrees.
  at::Tensor test_a = at::randn({500, d}, gen), test_b = test_a.clone();
  test_b.select(1, 3) += 0.5 * at::tanh(3 * test_a.select(1, 0)) * test_a.select(1, 1);
  const double linear =
      (basis->Decode(basis->Encode(test_a, d)) - test_b).pow(2).mean().item<double>();
  const double mlp =
      (aligner->Align(aligner->Encode(test_a, d)) - test_b).pow(2).mean().item<double>();
  EXPECT_LT(mlp, 0.3 * linear);
}

// Nested training (AlignerTrainOptions::nested_min_rank): the last code direction is a nonlinear
// function of the first two (linearly uncorrelated with them, and the smallest, so the basis
// orders it last). An aligner trained on full codes only cannot restore it when that column is
// not sent; one trained on truncated codes too predicts it from the columns that were sent.
TEST(AlignerTrainerTest, NestedTrainingServesTruncatedCodes) {
  at::Generator gen = at::detail::createCPUGenerator(5);
  const int64_t n = 6000, d = 8;
  auto sample = [&](int64_t rows) {
    at::Tensor a = at::randn({rows, d}, gen);
    a.select(1, d - 1).copy_(0.4 * at::tanh(2 * a.select(1, 0)) * a.select(1, 1) +
                             0.02 * at::randn({rows}, gen));
    return a;
  };
  at::Tensor a = sample(n);
  GramStats g(d, d);
  g.Add(a, a);
  auto basis = ReuseTranslator::Fit({g}, {FitMethod::kRrr, d, 0.99, 1e-6});
  ASSERT_TRUE(basis.ok());
  AlignerTrainOptions options = SmallAlignerOptions(30);
  AlignerTrainReport report;
  auto plain = TrainAligner(*basis, a, a, at::Tensor(), options, &report);
  ASSERT_TRUE(plain.ok()) << plain.status();
  options.nested_min_rank = d - 1;
  auto nested = TrainAligner(*basis, a, a, at::Tensor(), options, &report);
  ASSERT_TRUE(nested.ok()) << nested.status();

  at::Tensor test = sample(1000);
  auto error = [&](const PatchAligner& aligner, int64_t rank) {
    return (aligner.Align(aligner.Encode(test, rank)) - test).pow(2).mean().item<double>();
  };
  const double linear =
      (basis->Decode(basis->Encode(test, d - 1)) - test).pow(2).mean().item<double>();
  ASSERT_GT(linear, 1e-3);  // the dropped direction carries something
  EXPECT_GT(error(*plain, d - 1), 0.7 * linear);
  EXPECT_LT(error(*nested, d - 1), 0.4 * linear);
  // Both still decode full codes: the residual there is only the basis's ridge.
  EXPECT_LT(error(*nested, d), 0.1 * linear);
  EXPECT_LT(error(*plain, d), 0.1 * linear);
}

TEST(TextCorpusTest, SplitsDocumentsAndCutsSequences) {
  auto tokenizer = Tokenizer::FromFile(testing::ModelDir("stories260k") + "/tokenizer.json");
  ASSERT_TRUE(tokenizer.ok());
  testing::TempDir dir;
  std::string eot, blank;
  for (int i = 0; i < 12; ++i) {
    const std::string doc = "Story " + std::to_string(i) + ". Once upon a time there was a cat.";
    eot += doc + "\n<|endoftext|>\n";
    blank += doc + "\n\n";
  }
  testing::WriteFile(dir.File("eot.txt"), eot);
  testing::WriteFile(dir.File("blank.txt"), blank);
  for (const char* name : {"eot.txt", "blank.txt"}) {
    auto corpus = TextCorpus::Load(dir.File(name), **tokenizer);
    ASSERT_TRUE(corpus.ok()) << corpus.status();
    EXPECT_EQ(corpus->documents(), 12u) << name;
    auto seqs = corpus->Sequences(4, 30);
    ASSERT_TRUE(seqs.ok()) << seqs.status();
    ASSERT_EQ(seqs->size(), 4u);
    for (const auto& s : *seqs) {
      EXPECT_EQ(s.size(), 30u);
      EXPECT_EQ(s[0], 1);  // BOS
    }
    // Documents 0, 3, 6, 9 start the four sequences.
    auto story3 = (*tokenizer)->Encode("Story 3.", false);
    EXPECT_TRUE(std::equal(story3->begin(), story3->end(), (*seqs)[1].begin() + 1)) << name;
    EXPECT_FALSE(corpus->Sequences(20, 30).ok());          // more than there are documents
    EXPECT_FALSE(corpus->Sequences(2, 100000).ok());       // longer than the text
    EXPECT_TRUE(corpus->Sequences(1, 20, 0.9, 1.0).ok());  // from the last documents
  }
  EXPECT_EQ(TextCorpus::Load(dir.File("none.txt"), **tokenizer).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(FidelityTest, OracleAgainstItselfIsExactAndABrokenCacheIsNot) {
  auto model = testing::Ok(LlamaModel::Load(testing::ModelDir("stories260k"), {}));
  auto tokenizer =
      testing::Ok(Tokenizer::FromFile(testing::ModelDir("stories260k") + "/tokenizer.json"));
  auto corpus =
      *TextCorpus::Load(testing::SharedDir() + "/data/tinystories_valid_hf.txt", *tokenizer);
  FidelityOptions options{16, 8, 8};
  auto windows = testing::Ok(corpus.Sequences(6, 25));
  auto evaluator = FidelityEvaluator::Create(*model, windows, options);
  ASSERT_TRUE(evaluator.ok()) << evaluator.status();
  auto local = [&](int w, KvCache* cache, int64_t* bytes) -> absl::Status {
    *bytes = 0;
    return model->Forward(evaluator->Prefix(w), cache, {.logits = LogitsMode::kNone}).status();
  };
  auto m = evaluator->Evaluate(local, /*greedy=*/true);
  ASSERT_TRUE(m.ok()) << m.status();
  // The oracle and this prefill differ only in GEMM shapes (one call vs prefix + continuation),
  // i.e. float32 summation order: logits differ by <= ~64 eps32 * |logit| with |logit| < 30
  // here, log-probabilities (logit - logsumexp) by d <= twice that (4.6e-4), so
  // KL ~ Var(d) / 2 < d^2 / 2 = 1.1e-7, TV <= E|d| / 2 and the perplexity ratio is exp(mean d).
  const double d = 2 * 64 * testing::kFloat32Epsilon * 30;
  EXPECT_LE(m->kl, d * d / 2);
  EXPECT_LE(m->tv, d / 2);
  EXPECT_EQ(m->top1, 1.0);
  EXPECT_NEAR(m->ppl_ratio(), 1.0, d);
  EXPECT_EQ(m->greedy_agreement, 1.0);
  EXPECT_EQ(m->positions, 6 * 8);
  auto depth = evaluator->DepthErrors(local);
  // Relative l2 errors of the same activations computed in a different summation order.
  for (double e : *depth) EXPECT_LT(e, 64 * testing::kFloat32Epsilon);
  // A prefix of the wrong tokens: the consumer's view of the past is off.
  auto wrong = [&](int w, KvCache* cache, int64_t* bytes) -> absl::Status {
    *bytes = 100;
    return model->Forward(evaluator->Prefix((w + 1) % 6), cache, {.logits = LogitsMode::kNone})
        .status();
  };
  auto bad = evaluator->Evaluate(wrong, false);
  ASSERT_TRUE(bad.ok());
  EXPECT_GT(bad->kl, 0.01);
  EXPECT_LT(bad->top1, 1.0);
  EXPECT_NEAR(bad->bytes_per_token, 100.0 / 16, 1e-12);
  EXPECT_TRUE(std::isnan(bad->greedy_agreement));
  EXPECT_GT((*evaluator->DepthErrors(wrong))[1], 1e-3);
  // Windows of the wrong length are refused.
  EXPECT_FALSE(FidelityEvaluator::Create(*model, {std::vector<TokenId>(10, 1)}, options).ok());
}

}  // namespace
}  // namespace scd
