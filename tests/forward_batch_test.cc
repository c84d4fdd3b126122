// LlamaModel::ForwardBatch, the batched step, against per-sequence Forward calls on the real
// checkpoints (head dim 8: stories260k, llama2xs-260k; head dim 64: tinystories-4m):
// - one sequence alone in a step runs exactly what Forward runs (bit-identical logits and cache);
// - sequences batched together -- decodes beside prefill chunks, sequences joining and leaving --
//   give the logits each gets alone within the bound below, and the same greedy tokens;
// - bad batches are refused before any cache changes.
// Also with the weights packed below float32 on the CPU (model/packed_weight.h: "@int8",
// "@bf16"): their kernels give a row the same result in any batch, so batched steps hold the same
// bound; a chunked prefill also meets the rounding of each projection's input (InputRoundingBound).
//
// The bound. In a batch a sequence's rows go through GEMMs over the batch's rows where alone they
// went through GEMVs (one row): the same products summed in another order (OpenBLAS blocks the
// reduction differently for a matrix than for a vector; its GEMM kernel for a few rows differs
// again from the one for many). Attention, RoPE, norms and sampling are per sequence and unchanged.
// Each projection output is a dot product of at most K = max(hidden, intermediate) terms; two
// orders of the same sum differ by at most 2 gamma_K sum |x_i w_i| (Higham (3.4)), ~K eps32 of the
// magnitude in the worst case and far less in practice. Through L layers such differences add
// (each layer's residual update carries the earlier ones forward at the scale of the activations,
// RMSNorm keeping them relative), so the logits agree to eps32 * K * L of their largest
// magnitude: the bound GemvDecodeMatchesGemmDecode (model_runtime_test) already holds GEMV
// against GEMM to for whole generations. Greedy tokens then agree wherever the top two logits
// are further apart than that, which the reference runs below check first (a near-tie would make
// the token comparison meaningless, not wrong).
//
// The device: $SCD_TEST_DEVICE (tests/test_util.h), the CPU by default; with "cuda" the model and
// its caches live on the GPU and every assertion is the same. The bound holds there for the same
// reason. Alone a sequence's decode rows go through cuBLAS GEMVs, batched through cuBLAS GEMMs,
// whose kernels may also split the reduction over K between thread blocks (split-K) and add the
// partial sums afterwards: still the same K float32 products summed in another order, inside
// 2 gamma_K sum |x_i w_i|. That needs float32 products: TF32 (inputs rounded to 10-bit mantissas,
// ~2^-11 relative per product, some 10^4 eps32) would break the bound. libtorch leaves TF32 off
// for float32 matmuls (float32 matmul precision "highest": allowTF32CuBLAS() is false unless
// TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 or a caller sets it); the fixture asserts that it is off.
// Unlike the CPU's, the GPU's other reductions may change order with the batch too: ATen's CUDA
// reduction kernels choose their thread layout from the tensor's shape, so a row's RMSNorm mean
// of squares (hidden <= K non-negative terms) may be summed differently among the batch's rows
// than alone, a relative difference of at most gamma_hidden in the row's scale. Attention runs
// per sequence on the shapes it has alone (scores over head_dim terms, outputs over at most 64
// cached keys here, both < K). So every difference is again a float32 sum of at most K terms in
// another order, of the kind and size the per-layer K eps32 already counts.
// One sequence alone in a step is bit-identical on the GPU as well: the same kernels on the same
// shapes, and cuBLAS returns bit-identical results for the same call on one stream.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "model/generator.h"
#include "model/llama_model.h"
#include "model/runtime.h"
#include "tests/test_util.h"

namespace scd {
namespace {

double ReorderBound(const ModelConfig& c) {
  return testing::kFloat32Epsilon *
         static_cast<double>(std::max(c.hidden_size, c.intermediate_size)) *
         static_cast<double>(c.num_layers);
}

// Packed weights round a projection's input before multiplying (model/packed_weight.h): to bf16
// (relative error at most u = 2^-9 per element) or to the row's int8 grid (at most half a step,
// max|x| / 254). Two computations of the same row that differ by float rounding elsewhere (a
// chunked prefill's attention sums its keys in another order than the whole prompt's) may round an
// element to neighbouring values: the projection's output then moves by at most 2 u sum |x w|, a
// relative 2 u of its scale per layer, L layers adding up. f16 weights keep x in float32: nothing
// more than the reorder bound.
double InputRoundingBound(const ModelConfig& c, WeightFormat format) {
  const double u = format == WeightFormat::kBF16   ? 1.0 / 512
                   : format == WeightFormat::kInt8 ? 1.0 / 254
                                                   : 0.0;
  return 2 * u * static_cast<double>(c.num_layers);
}

// The largest logit minus the runner-up, relative to the largest magnitude.
double TopTwoGap(const at::Tensor& logits) {
  at::Tensor row = logits.reshape({-1}).to(at::kDouble);
  at::Tensor top = std::get<0>(row.topk(2));
  return (top[0] - top[1]).item<double>() / row.abs().max().item<double>();
}

// A sequence generated alone with Forward: greedy tokens and the logits before each.
struct AloneRun {
  std::vector<TokenId> tokens;
  std::vector<at::Tensor> logits;  // logits[i]: the distribution tokens[i] was picked from
};

AloneRun RunAlone(const LlamaModel& model, const std::vector<TokenId>& prompt, int steps) {
  AloneRun run;
  KvCache cache = model.NewCache(static_cast<int64_t>(prompt.size()) + steps);
  absl::StatusOr<ForwardOutput> out = model.Forward(prompt, &cache);
  EXPECT_TRUE(out.ok()) << out.status();
  for (int i = 0; i < steps && out.ok(); ++i) {
    const TokenId next = static_cast<TokenId>(out->logits.argmax().item<int64_t>());
    run.logits.push_back(out->logits.clone());
    run.tokens.push_back(next);
    const TokenId input[] = {next};
    out = model.Forward(input, &cache);
    EXPECT_TRUE(out.ok()) << out.status();
  }
  return run;
}

std::vector<TokenId> Prompt(const std::string& model, int index, size_t length) {
  return testing::GoldenContinuation(model, index, length);
}

class ForwardBatchTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const absl::StatusOr<c10::Device> device = testing::TestDevice();
    ASSERT_TRUE(device.ok()) << device.status();
    if (device->is_cuda()) {
      // The bound above assumes float32 products in cuBLAS (libtorch's default: no TF32).
      ASSERT_FALSE(at::globalContext().allowTF32CuBLAS()) << "TF32 is on for float32 matmuls";
    }
    LlamaModel::Options options;
    options.device = *device;
    const std::string param = GetParam();
    const size_t at = param.find('@');
    name_ = param.substr(0, at);
    if (at != std::string::npos) {
      if (!device->is_cpu()) GTEST_SKIP() << "packed weights run on the CPU";
      options.weights = testing::Ok(ParsePrecision(param.substr(at + 1), *device)).weights;
    }
    model_ = testing::Ok(LlamaModel::Load(testing::ModelDir(name_), options));
  }
  const std::string& Name() const { return name_; }
  std::string name_;
  std::unique_ptr<LlamaModel> model_;
};

TEST_P(ForwardBatchTest, OneSequenceIsBitIdenticalToForward) {
  const std::vector<TokenId> prompt = Prompt(Name(), 1, 20);
  KvCache a = model_->NewCache(32), b = model_->NewCache(32);
  auto alone = testing::Ok(model_->Forward(prompt, &a));
  const BatchSequence seq{prompt, &b, nullptr, true};
  auto batched = testing::Ok(model_->ForwardBatch({&seq, 1}));
  ASSERT_EQ(batched.size(), 1u);
  EXPECT_TRUE(at::equal(alone.logits, batched[0]));
  for (int l = 0; l < model_->config().num_layers; ++l) {
    EXPECT_TRUE(at::equal(a.keys(l), b.keys(l))) << l;
    EXPECT_TRUE(at::equal(a.values(l), b.values(l))) << l;
  }
  // A decode step (one row: GEMV in both) too.
  const TokenId next[] = {7};
  alone = testing::Ok(model_->Forward(next, &a));
  const BatchSequence step{next, &b, nullptr, true};
  batched = testing::Ok(model_->ForwardBatch({&step, 1}));
  EXPECT_TRUE(at::equal(alone.logits, batched[0]));
}

// Four sequences of different prompts and lengths: three prefill together in one step, then
// decode together; the fourth joins at step 3 (its whole prompt as a chunk beside three decodes);
// the first leaves after 5 tokens. Every token and every logit row against the sequence alone.
TEST_P(ForwardBatchTest, BatchedSequencesMatchEachAlone) {
  const ModelConfig& c = model_->config();
  const double bound = ReorderBound(c);
  constexpr int kSteps = 12;
  const std::vector<std::pair<int, size_t>> wanted = {{0, 9}, {1, 23}, {2, 14}, {3, 31}};
  const std::vector<int> joins = {0, 0, 0, 3};  // step a sequence's prompt runs in
  const std::vector<int> lengths = {5, kSteps, kSteps, kSteps - 3};  // tokens it generates
  // Near-ties make a token comparison meaningless: each prompt is the first of its golden text's
  // prefixes from the wanted length on whose lone run has none among the tokens compared.
  std::vector<std::vector<TokenId>> prompts;
  std::vector<AloneRun> alone;
  for (size_t s = 0; s < wanted.size(); ++s) {
    for (size_t length = wanted[s].second; length < wanted[s].second + 12; ++length) {
      std::vector<TokenId> prompt = Prompt(Name(), wanted[s].first, length);
      AloneRun run = RunAlone(*model_, prompt, kSteps);
      bool clear = true;
      for (int i = 0; i < lengths[s]; ++i) clear = clear && TopTwoGap(run.logits[i]) > 2 * bound;
      if (!clear) continue;
      prompts.push_back(std::move(prompt));
      alone.push_back(std::move(run));
      break;
    }
    ASSERT_EQ(prompts.size(), s + 1) << "no prompt without a near-tie for sequence " << s;
  }

  std::vector<KvCache> caches;
  for (size_t s = 0; s < prompts.size(); ++s) caches.push_back(model_->NewCache(64));
  std::vector<std::vector<TokenId>> got(prompts.size());
  double worst = 0;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<BatchSequence> batch;
    std::vector<size_t> who;
    std::vector<TokenId> inputs(prompts.size());
    for (size_t s = 0; s < prompts.size(); ++s) {
      if (step < joins[s] || static_cast<int>(got[s].size()) >= lengths[s]) continue;
      if (step == joins[s]) {
        batch.push_back({prompts[s], &caches[s], nullptr, true});
      } else {
        inputs[s] = got[s].back();
        batch.push_back({absl::MakeConstSpan(&inputs[s], 1), &caches[s], nullptr, true});
      }
      who.push_back(s);
    }
    if (batch.empty()) break;
    auto logits = testing::Ok(model_->ForwardBatch(batch));
    for (size_t i = 0; i < who.size(); ++i) {
      const size_t s = who[i];
      const size_t k = got[s].size();
      const double diff = testing::MaxRelDiff(logits[i], alone[s].logits[k]);
      worst = std::max(worst, diff);
      EXPECT_LE(diff, bound) << "sequence " << s << " token " << k << " at step " << step;
      got[s].push_back(static_cast<TokenId>(logits[i].argmax().item<int64_t>()));
    }
  }
  for (size_t s = 0; s < prompts.size(); ++s) {
    const std::vector<TokenId> expected(alone[s].tokens.begin(),
                                        alone[s].tokens.begin() + lengths[s]);
    EXPECT_EQ(got[s], expected) << "sequence " << s;
  }
  std::printf(
      "%s on %s: largest logit difference batched vs alone %.3g of the magnitude (bound %.3g)\n",
      GetParam().c_str(), model_->device().str().c_str(), worst, bound);
}

// A chunked prefill (the prompt in pieces beside a decoding sequence) leaves the cache and the
// last logits a single Forward of the whole prompt gives, within the bound.
TEST_P(ForwardBatchTest, ChunkedPrefillMatchesAWholePrefill) {
  const ModelConfig& c = model_->config();
  const std::vector<TokenId> prompt = Prompt(Name(), 3, 40);
  KvCache whole = model_->NewCache(48), chunked = model_->NewCache(48),
          other = model_->NewCache(64);
  auto reference = testing::Ok(model_->Forward(prompt, &whole));
  const std::vector<TokenId> other_prompt = Prompt(Name(), 0, 6);
  testing::Ok(model_->Forward(other_prompt, &other));
  at::Tensor last;
  TokenId decode_input = 5;
  for (size_t at = 0; at < prompt.size(); at += 7) {
    const size_t n = std::min<size_t>(7, prompt.size() - at);
    const BatchSequence batch[] = {
        {absl::MakeConstSpan(&decode_input, 1), &other, nullptr, true},
        {absl::MakeConstSpan(prompt).subspan(at, n), &chunked, nullptr, at + n == prompt.size()}};
    auto logits = testing::Ok(model_->ForwardBatch(batch));
    ASSERT_TRUE(logits[0].defined());
    EXPECT_EQ(logits[1].defined(), at + n == prompt.size());
    if (logits[1].defined()) last = logits[1];
  }
  const double bound = ReorderBound(c) + InputRoundingBound(c, model_->weight_format());
  EXPECT_LE(testing::MaxRelDiff(last, reference.logits), bound);
  for (int l = 0; l < c.num_layers; ++l) {
    EXPECT_LE(testing::MaxRelDiff(chunked.keys(l), whole.keys(l)), bound) << l;
    EXPECT_LE(testing::MaxRelDiff(chunked.values(l), whole.values(l)), bound) << l;
  }
}

// logit_rows: the logits of a sequence's last rows, as a whole Forward with every row's logits
// gives them (the LM head over fewer rows: the reorder bound), beside a sequence asking for one.
TEST_P(ForwardBatchTest, LogitRowsAreTheLastRowsOfAWholeForward) {
  const std::vector<TokenId> prompt = Prompt(Name(), 1, 20), other = Prompt(Name(), 2, 9);
  KvCache a = model_->NewCache(32), b = model_->NewCache(32), c = model_->NewCache(32);
  const at::Tensor all =
      testing::Ok(model_->Forward(prompt, &a, {.logits = LogitsMode::kAll})).logits;
  const BatchSequence batch[] = {{prompt, &b, nullptr, true, 5}, {other, &c, nullptr, true}};
  const std::vector<at::Tensor> out = testing::Ok(model_->ForwardBatch(batch));
  ASSERT_EQ(out[0].size(0), 5);
  ASSERT_EQ(out[1].size(0), 1);
  const ModelConfig& config = model_->config();
  const double bound = ReorderBound(config) + InputRoundingBound(config, model_->weight_format());
  EXPECT_LE(testing::MaxRelDiff(out[0], all.narrow(0, 15, 5)), bound);
}

TEST_P(ForwardBatchTest, BadBatchesAreRefusedBeforeAnyCacheChanges) {
  const std::vector<TokenId> prompt = Prompt(Name(), 0, 5);
  KvCache a = model_->NewCache(8), b = model_->NewCache(8);
  EXPECT_EQ(model_->ForwardBatch({}).status().code(), absl::StatusCode::kInvalidArgument);
  const BatchSequence shared[] = {{prompt, &a, nullptr, true}, {prompt, &a, nullptr, true}};
  EXPECT_EQ(model_->ForwardBatch(shared).status().code(), absl::StatusCode::kInvalidArgument);
  const BatchSequence empty[] = {{prompt, &a, nullptr, true}, {{}, &b, nullptr, true}};
  EXPECT_EQ(model_->ForwardBatch(empty).status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<TokenId> too_long(model_->config().max_position_embeddings + 1, 3);
  const BatchSequence past[] = {{prompt, &a, nullptr, true}, {too_long, &b, nullptr, true}};
  EXPECT_EQ(model_->ForwardBatch(past).status().code(), absl::StatusCode::kOutOfRange);
  const std::vector<TokenId> bad_id = {1, static_cast<TokenId>(model_->config().vocab_size)};
  const BatchSequence vocab[] = {{prompt, &a, nullptr, true}, {bad_id, &b, nullptr, true}};
  EXPECT_EQ(model_->ForwardBatch(vocab).status().code(), absl::StatusCode::kInvalidArgument);
  for (int64_t rows : {0, 6}) {  // logits of no row; of more rows than its 5 tokens
    const BatchSequence asked[] = {{prompt, &a, nullptr, true, rows}};
    EXPECT_EQ(model_->ForwardBatch(asked).status().code(), absl::StatusCode::kInvalidArgument)
        << rows;
  }
  EXPECT_EQ(a.length(), 0);
  EXPECT_EQ(b.length(), 0);
}

INSTANTIATE_TEST_SUITE_P(RealCheckpoints, ForwardBatchTest,
                         ::testing::Values("stories260k", "llama2xs-260k", "tinystories-4m",
                                           "stories260k@int8", "tinystories-4m@int8",
                                           "tinystories-4m@bf16"),
                         [](const auto& info) { return testing::TestNameOf(info.param); });

}  // namespace
}  // namespace scd
