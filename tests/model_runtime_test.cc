// Runtime behaviour beyond the goldens: incremental decode, external caches, layer ranges,
// sliding windows, biases, RoPE variants and the blocked attention, each checked against an
// independent computation (a full forward, or the naive reference forward below).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "model/generator.h"
#include "model/llama_model.h"
#include "tests/test_util.h"

namespace scd {
namespace {

// Two float32 computations of the same values that differ only in the order of their sums (block
// sizes, fused vs separate projections, GEMV vs GEMM) agree to k eps32 of the magnitude compared,
// k a small multiple of the accumulation depth's logarithm in practice; 64 leaves room for the
// few layers these models have.
constexpr double kReordered = 64 * testing::kFloat32Epsilon;

std::unique_ptr<LlamaModel> LoadShared(const std::string& name) {
  auto model = LlamaModel::Load(testing::ModelDir(name), {});
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(*model) : nullptr;
}

std::vector<TokenId> Ids(std::initializer_list<int> values) {
  return {values.begin(), values.end()};
}

// A straightforward HF-style forward: repeat_kv, full [heads, T, T] scores with an explicit mask,
// RoPE from its textbook formula. Shares no code with LlamaModel beyond the weights.
at::Tensor ReferenceLogits(const LlamaModel& model, const std::vector<TokenId>& tokens) {
  const ModelConfig& c = model.config();
  const ModelWeights& w = model.weights();
  const int64_t T = static_cast<int64_t>(tokens.size()), H = c.num_heads, Hkv = c.num_kv_heads,
                hd = c.head_dim;
  auto dbl = at::TensorOptions().dtype(at::kDouble);
  at::Tensor ids = at::tensor(std::vector<int64_t>(tokens.begin(), tokens.end()));
  at::Tensor h = w.embed.to(at::kDouble).index_select(0, ids);
  auto norm = [&](const at::Tensor& x, const at::Tensor& g) {
    return x / at::sqrt(x.pow(2).mean(-1, true) + c.rms_norm_eps) * g.to(at::kDouble);
  };
  auto linear = [](const at::Tensor& x, const at::Tensor& wt, const at::Tensor& b) {
    at::Tensor y = at::matmul(x, wt.to(at::kDouble).t());
    return b.defined() ? y + b.to(at::kDouble) : y;
  };
  // inv_freq_i = theta^(-2i/hd) with the model's scaling, angle = pos * inv_freq.
  const auto& inv = model.rope().inv_freq();
  at::Tensor angles = at::empty({T, hd / 2}, dbl);
  for (int64_t p = 0; p < T; ++p) {
    for (int64_t i = 0; i < hd / 2; ++i) angles[p][i] = static_cast<double>(p) * inv[i];
  }
  at::Tensor cos = at::cat({angles.cos(), angles.cos()}, -1),
             sin = at::cat({angles.sin(), angles.sin()}, -1);
  auto rope = [&](const at::Tensor& x) {  // [heads, T, hd]
    at::Tensor rotated = at::cat({-x.narrow(-1, hd / 2, hd / 2), x.narrow(-1, 0, hd / 2)}, -1);
    return x * cos + rotated * sin;
  };
  at::Tensor mask = at::zeros({T, T}, dbl);
  for (int64_t i = 0; i < T; ++i) {
    for (int64_t j = 0; j < T; ++j) {
      bool visible = j <= i && (!c.sliding_window || i - j < *c.sliding_window);
      if (!visible) mask[i][j] = -INFINITY;
    }
  }
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& lw = w.layers[l];
    at::Tensor x = norm(h, lw.attn_norm);
    at::Tensor bq = lw.bqkv.defined() ? lw.bqkv.narrow(0, 0, c.q_dim()) : at::Tensor();
    at::Tensor q = linear(x, lw.Wq(c), bq).view({T, H, hd}).transpose(0, 1);
    at::Tensor k = linear(x, lw.Wk(c), lw.Bk(c)).view({T, Hkv, hd}).transpose(0, 1);
    at::Tensor v = linear(x, lw.Wv(c), lw.Bv(c)).view({T, Hkv, hd}).transpose(0, 1);
    q = rope(q);
    k = rope(k).repeat_interleave(H / Hkv, 0);
    v = v.repeat_interleave(H / Hkv, 0);
    at::Tensor scores =
        at::matmul(q, k.transpose(1, 2)) / std::sqrt(static_cast<double>(hd)) + mask;
    at::Tensor attn = at::matmul(at::softmax(scores, -1), v).transpose(0, 1).reshape({T, H * hd});
    h = h + linear(attn, lw.wo, lw.bo);
    x = norm(h, lw.mlp_norm);
    const int64_t f = c.intermediate_size;
    at::Tensor bg = lw.b_gate_up.defined() ? lw.b_gate_up.narrow(0, 0, f) : at::Tensor();
    at::Tensor bu = lw.b_gate_up.defined() ? lw.b_gate_up.narrow(0, f, f) : at::Tensor();
    at::Tensor gate = linear(x, lw.w_gate_up.narrow(0, 0, f), bg);
    at::Tensor up = linear(x, lw.w_gate_up.narrow(0, f, f), bu);
    h = h + linear(at::silu(gate) * up, lw.w_down, lw.b_down);
  }
  return linear(norm(h, w.final_norm), w.lm_head, at::Tensor());
}

ModelConfig SmallConfig(const std::string& type) {
  ModelConfig c;
  c.model_type = type;
  c.hidden_size = 48;
  c.intermediate_size = 80;
  c.num_layers = 3;
  c.num_heads = 6;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.vocab_size = 97;
  c.max_position_embeddings = 1024;
  c.rms_norm_eps = 1e-6;
  c.eos_token_ids = {2};
  return c;
}

std::vector<TokenId> RandomTokens(int64_t n, int64_t vocab, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  at::Tensor t = at::randint(vocab, {n}, gen, at::TensorOptions().dtype(at::kLong));
  return std::vector<TokenId>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + n);
}

at::Tensor FullLogits(const LlamaModel& model, const std::vector<TokenId>& tokens) {
  KvCache cache = model.NewCache(static_cast<int64_t>(tokens.size()));
  auto out = model.Forward(tokens, &cache, {.logits = LogitsMode::kAll});
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? out->logits : at::Tensor();
}

TEST(ReferenceForwardTest, AgreesWithSharedGoldenLogits) {
  // Validates the reference itself before it judges anything else.
  auto model = LoadShared("stories260k");
  testing::Golden golden = testing::LoadGolden("stories260k");
  EXPECT_LE(testing::MaxRelDiff(ReferenceLogits(*model, golden.prompts[2].ids),
                                golden.Tensor("p2.logits")),
            kReordered);  // the float64-computed golden, our float32 reference
}

TEST(RuntimeTest, IncrementalDecodeEqualsFullForward) {
  for (const char* name : {"stories260k", "tinystories-4m"}) {
    auto model = LoadShared(name);
    std::vector<TokenId> seq = testing::LoadGolden(name).prompts[0].ids;
    const size_t prompt_len = seq.size();
    KvCache cache = model->NewCache(8);  // small on purpose: exercises growth
    auto out = model->Forward(seq, &cache);
    ASSERT_TRUE(out.ok());
    std::vector<at::Tensor> step_logits = {out->logits};
    for (int step = 0; step < 24; ++step) {
      seq.push_back(static_cast<TokenId>(step_logits.back().argmax(-1).item<int64_t>()));
      auto next = model->Forward({seq.back()}, &cache);
      ASSERT_TRUE(next.ok());
      step_logits.push_back(next->logits);
    }
    at::Tensor full = FullLogits(*model, seq);
    at::Tensor incremental = at::cat(step_logits, 0);
    EXPECT_LE(testing::MaxRelDiff(incremental, full.narrow(0, prompt_len - 1, incremental.size(0))),
              kReordered)
        << name;
  }
}

TEST(RuntimeTest, ChunkedPrefillEqualsOneShot) {
  auto model = LoadShared("tinystories-4m");
  std::vector<TokenId> tokens = RandomTokens(150, 512, 7);
  KvCache cache = model->NewCache(16);
  std::vector<at::Tensor> parts;
  for (size_t begin = 0; begin < tokens.size(); begin += 37) {
    size_t end = std::min(tokens.size(), begin + 37);
    auto out = model->Forward(absl::MakeConstSpan(tokens).subspan(begin, end - begin), &cache,
                              {.logits = LogitsMode::kAll});
    ASSERT_TRUE(out.ok());
    parts.push_back(out->logits);
  }
  EXPECT_LE(testing::MaxRelDiff(at::cat(parts, 0), FullLogits(*model, tokens)), kReordered);
}

class ExternalCacheTest : public ::testing::TestWithParam<KeyFormat> {};

TEST_P(ExternalCacheTest, DecodingFromExternalCacheEqualsNative) {
  for (const char* name : {"stories260k", "tinystories-4m"}) {
    auto model = LoadShared(name);
    const std::vector<TokenId> prompt = testing::LoadGolden(name).prompts[2].ids;
    const int64_t prefix = static_cast<int64_t>(prompt.size()) - 1;
    // Producer side: a prefill of all but the last token, capturing pre-RoPE K and V.
    CaptureSpec spec;
    spec.key_prerope = spec.value = true;
    for (int l = 0; l < model->config().num_layers; ++l) spec.layers.push_back(l);
    KvCache producer = model->NewCache(prefix);
    auto captured = model->Forward(absl::MakeConstSpan(prompt).first(prefix), &producer,
                                   {.logits = LogitsMode::kNone, .capture = &spec});
    ASSERT_TRUE(captured.ok());
    // Consumer side: install the transferred prefix, then continue.
    KvCache consumer = model->NewCache(prefix);
    for (const auto& [layer, cap] : captured->captures) {
      at::Tensor keys = cap.key_prerope;
      if (GetParam() == KeyFormat::kPostRope) {
        keys = model->rope().Apply(keys, at::arange(prefix, at::TensorOptions().dtype(at::kLong)));
      }
      ASSERT_TRUE(model->LoadPrefix(layer, keys, cap.value, GetParam(), &consumer).ok());
    }
    GenerationOptions options;
    options.max_tokens = 30;
    options.ignore_eos = true;
    KvCache native = model->NewCache(64);
    auto expected = GenerateTokens(*model, prompt, &native, options);
    auto actual = GenerateTokens(*model, prompt, &consumer, options);
    ASSERT_TRUE(expected.ok() && actual.ok());
    EXPECT_EQ(actual->output_ids, expected->output_ids) << name;
    // The two caches hold the same keys rotated by two implementations of RoPE (the fused
    // per-step tables vs RotaryEmbedding::Apply): their float32 angles p * inv_freq differ by up
    // to ~p ulps for position p, so keys agree to ~(positions + a few) eps32 of their magnitude.
    // Values are copied, not recomputed: they agree to a few eps32 (summation order only).
    const double key_bound = testing::kFloat32Epsilon * static_cast<double>(prompt.size() + 30 + 8);
    const double value_bound = 8 * testing::kFloat32Epsilon;
    for (int l = 0; l < model->config().num_layers; ++l) {
      EXPECT_LE(testing::MaxRelDiff(consumer.keys(l), native.keys(l)), key_bound)
          << name << " " << l;
      EXPECT_LE(testing::MaxRelDiff(consumer.values(l), native.values(l)), value_bound) << name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, ExternalCacheTest,
                         ::testing::Values(KeyFormat::kPreRope, KeyFormat::kPostRope),
                         [](const auto& info) {
                           return info.param == KeyFormat::kPreRope ? "PreRope" : "PostRope";
                         });

TEST(RuntimeTest, ExternalPrefixRejectsWrongShapes) {
  auto model = LoadShared("stories260k");
  KvCache cache = model->NewCache(8);
  at::Tensor bad = at::zeros({3, 5, 8});
  at::Tensor good = at::zeros({4, 5, 8});
  absl::Status s = model->LoadPrefix(0, bad, good, KeyFormat::kPreRope, &cache);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("keys must be [4, T, 8]"), std::string::npos) << s;
  EXPECT_FALSE(model->LoadPrefix(7, good, good, KeyFormat::kPreRope, &cache).ok());
  EXPECT_FALSE(model->LoadPrefix(0, good, at::zeros({4, 6, 8}), KeyFormat::kPreRope, &cache).ok());
}

TEST(RuntimeTest, LayerRangeEqualsSameLayersInsideFullForward) {
  auto model = LoadShared("tinystories-4m");
  const std::vector<TokenId> tokens = testing::LoadGolden("tinystories-4m").prompts[2].ids;
  CaptureSpec spec;
  spec.residual = true;
  spec.layers = {2, 5};
  KvCache full_cache = model->NewCache(64);
  auto full = model->Forward(tokens, &full_cache, {.logits = LogitsMode::kAll, .capture = &spec});
  ASSERT_TRUE(full.ok());
  // Re-enter at layer 2 with the residual stream entering it; run [2, 5).
  KvCache cache = model->NewCache(64);
  auto h = model->RunLayers(2, 5, full->captures[2].residual, &cache);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_LE(testing::MaxRelDiff(*h, full->captures[5].residual), kReordered);
  for (int l = 2; l < 5; ++l) {
    EXPECT_EQ(cache.length(l), static_cast<int64_t>(tokens.size()));
    EXPECT_LE(testing::MaxRelDiff(cache.keys(l), full_cache.keys(l)), kReordered);
  }
  EXPECT_EQ(cache.length(0), 0);
  // Finishing the stack from layer 5 gives the full forward's logits.
  auto tail = model->RunLayers(5, 6, *h, &cache);
  ASSERT_TRUE(tail.ok());
  EXPECT_LE(testing::MaxRelDiff(model->Logits(*tail), full->logits), kReordered);
  // Mismatched layer lengths are refused.
  EXPECT_EQ(model->RunLayers(1, 3, *h, &cache).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(model->RunLayers(3, 2, *h, &cache).ok());
}

// The producer's per-layer hand-off: every layer reaches the callback in order, before its
// attention and MLP run, with exactly the activations a plain capture records (same ops, same
// order: bit-identical), and the logits and cache are unchanged; a callback error stops the pass at that layer and is returned.
TEST(RuntimeTest, LayerCallbackSeesEachLayerInOrderWithTheSameCaptures) {
  auto model = LoadShared("tinystories-4m");
  const std::vector<TokenId> tokens = testing::LoadGolden("tinystories-4m").prompts[2].ids;
  CaptureSpec spec = CaptureSpec::All(model->config());
  spec.layers = {0, 3, 5};
  KvCache plain_cache = model->NewCache(64);
  auto plain = model->Forward(tokens, &plain_cache, {.capture = &spec});
  ASSERT_TRUE(plain.ok()) << plain.status();

  std::vector<int> order;
  Captures handed;
  KvCache cache = model->NewCache(64);
  ForwardOptions options{.capture = &spec};
  options.on_layer = [&](int layer, LayerCapture capture) {
    order.push_back(layer);
    // The callback runs as soon as the layer's K/V are projected, before its attention: the
    // previous layer is complete (its K/V in the cache), this one's are not appended yet.
    EXPECT_EQ(cache.length(layer), 0);
    if (layer > 0) {
      EXPECT_EQ(cache.length(layer - 1), static_cast<int64_t>(tokens.size()));
    }
    if (capture.key_prerope.defined()) handed[layer] = std::move(capture);
    return absl::OkStatus();
  };
  auto out = model->Forward(tokens, &cache, options);
  ASSERT_TRUE(out.ok()) << out.status();
  std::vector<int> all(model->config().num_layers);
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(order, all);
  EXPECT_TRUE(out->captures.empty());  // handed over, not kept
  ASSERT_EQ(handed.size(), plain->captures.size());
  for (const auto& [layer, capture] : plain->captures) {
    EXPECT_TRUE(at::equal(handed[layer].key_prerope, capture.key_prerope)) << layer;
    EXPECT_TRUE(at::equal(handed[layer].value, capture.value)) << layer;
    EXPECT_TRUE(at::equal(handed[layer].attn_input, capture.attn_input)) << layer;
  }
  EXPECT_TRUE(at::equal(out->logits, plain->logits));
  EXPECT_TRUE(at::equal(cache.keys(4), plain_cache.keys(4)));

  // An error at layer 1 stops the pass there.
  KvCache stopped = model->NewCache(64);
  int calls = 0;
  options.on_layer = [&](int layer, LayerCapture) {
    ++calls;
    return layer == 1 ? absl::CancelledError("consumer went away") : absl::OkStatus();
  };
  auto failed = model->Forward(tokens, &stopped, options);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(std::string(failed.status().message()), ::testing::HasSubstr("consumer went away"));
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(stopped.length(2), 0);
}

TEST(RuntimeTest, BlockedAttentionMatchesReferenceAcrossBlockBoundaries) {
  // Long enough for several 256-row query blocks (group 3 -> 85 tokens per block).
  auto model = LlamaModel::Dummy(SmallConfig("llama"), 1, {});
  std::vector<TokenId> tokens = RandomTokens(300, 97, 3);
  EXPECT_LE(testing::MaxRelDiff(FullLogits(*model, tokens), ReferenceLogits(*model, tokens)),
            kReordered);
}

TEST(RuntimeTest, PromptRowsOnTheAttentionKernelAndOnATenMatchTheReference) {
  // A prompt segment attends row by row on DecodeAttention where the CPU runs it and its work is
  // within the limit (LlamaModel::AttendRowsOnKernel), otherwise on ATen's blocked products:
  // both against the reference, at 256 and 257 rows (ATen's query blocks hold 85 tokens here),
  // whole and as a second chunk after a prefix (its rows then see keys they did not append),
  // with a sliding window too.
  for (int64_t kernel_work : {int64_t{1} << 40, int64_t{0}}) {
    for (bool windowed : {false, true}) {
      ModelConfig c = SmallConfig("mistral");
      if (windowed) c.sliding_window = 40;
      LlamaModel::Options options;
      options.prompt_attention_kernel_work = kernel_work;
      const bool kernel = kernel_work > 0;
      auto model = LlamaModel::Dummy(c, 5, options);
      const std::vector<TokenId> tokens = RandomTokens(257 + 100, 97, 6);
      const at::Tensor reference = ReferenceLogits(*model, tokens);
      for (int64_t rows : {256, 257}) {
        const std::vector<TokenId> prompt(tokens.begin(), tokens.begin() + rows);
        EXPECT_LE(testing::MaxRelDiff(FullLogits(*model, prompt), reference.narrow(0, 0, rows)),
                  kReordered)
            << "kernel " << kernel << " window " << windowed << " rows " << rows;
        KvCache cache = model->NewCache(8);
        ASSERT_TRUE(model->Forward(absl::MakeConstSpan(tokens).first(100), &cache).ok());
        auto chunk = model->Forward(absl::MakeConstSpan(tokens).subspan(100, rows), &cache,
                                    {.logits = LogitsMode::kAll});
        ASSERT_TRUE(chunk.ok()) << chunk.status();
        EXPECT_LE(testing::MaxRelDiff(chunk->logits, reference.narrow(0, 100, rows)), kReordered)
            << "kernel " << kernel << " window " << windowed << " chunk of " << rows;
      }
    }
  }
}

TEST(RuntimeTest, MistralSlidingWindowMatchesReference) {
  ModelConfig c = SmallConfig("mistral");
  c.sliding_window = 7;
  auto model = LlamaModel::Dummy(c, 2, {});
  std::vector<TokenId> tokens = RandomTokens(200, 97, 4);
  at::Tensor reference = ReferenceLogits(*model, tokens);
  EXPECT_LE(testing::MaxRelDiff(FullLogits(*model, tokens), reference), kReordered);
  // Decode steps respect the window too.
  KvCache cache = model->NewCache(8);
  ASSERT_TRUE(model->Forward(absl::MakeConstSpan(tokens).first(150), &cache).ok());
  for (size_t i = 150; i < tokens.size(); ++i) {
    auto out = model->Forward({tokens[i]}, &cache);
    ASSERT_TRUE(out.ok());
    EXPECT_LE(testing::MaxRelDiff(out->logits, reference.narrow(0, i, 1)), kReordered) << i;
  }
  // The window matters: without it the logits differ.
  ModelConfig full = c;
  full.sliding_window.reset();
  auto unwindowed = LlamaModel::Dummy(full, 2, {});
  EXPECT_GT(testing::MaxRelDiff(FullLogits(*unwindowed, tokens), reference), 1e-3);
}

TEST(RuntimeTest, Qwen2BiasesMatchReference) {
  ModelConfig c = SmallConfig("qwen2");
  c.qkv_bias = true;
  c.rope.theta = 1e6;
  ModelWeights w = ModelWeights::Dummy(c, 5, at::kFloat, at::kCPU);
  for (LayerWeights& lw : w.layers) lw.bqkv.normal_(0, 0.5);  // make the biases matter
  auto model = LlamaModel::FromWeights(c, std::move(w), {});
  std::vector<TokenId> tokens = RandomTokens(40, 97, 6);
  EXPECT_LE(testing::MaxRelDiff(FullLogits(*model, tokens), ReferenceLogits(*model, tokens)),
            kReordered);
}

TEST(RopeTest, LinearScalingEqualsPositionDivision) {
  RopeConfig plain;
  RopeConfig linear;
  linear.scaling = RopeScalingType::kLinear;
  linear.factor = 4.0;
  RotaryEmbedding a(plain, 16), b(linear, 16);
  at::Tensor x = at::randn({2, 5, 16});
  at::Tensor pos = at::tensor(std::vector<int64_t>{0, 4, 8, 40, 400});
  auto [cos_a, sin_a] = a.Tables(pos.to(at::kDouble) / 4.0, x);
  auto [cos_b, sin_b] = b.Tables(pos, x);
  // Angles p * inv / f vs (p / f) * inv differ by ~2 eps32 of the angle (< 64 rad here), and
  // cos/sin move at most as much: an absolute bound on values in [-1, 1].
  EXPECT_LE(testing::MaxAbsDiff(cos_a, cos_b), 2 * 64 * testing::kFloat32Epsilon);
  EXPECT_LE(testing::MaxAbsDiff(sin_a, sin_b), 2 * 64 * testing::kFloat32Epsilon);
}

// Llama 3's published rope scaling.
RopeConfig Llama3Rope() {
  RopeConfig r;
  r.theta = 500000;
  r.scaling = RopeScalingType::kLlama3;
  r.factor = 8;
  r.low_freq_factor = 1;
  r.high_freq_factor = 4;
  r.original_max_position_embeddings = 8192;
  return r;
}

TEST(RopeTest, Llama3ScalingFollowsPublishedFormula) {
  RotaryEmbedding rope(Llama3Rope(), 128);
  for (int i = 0; i < 64; ++i) {
    double f = std::pow(500000.0, -2.0 * i / 128);
    double wavelen = 2 * M_PI / f;
    double expected = f;
    if (wavelen > 8192.0) {  // low frequencies are slowed by the factor
      expected = f / 8;
    } else if (wavelen >= 2048.0) {  // smooth blend between 8192/4 and 8192/1
      double smooth = (8192.0 / wavelen - 1) / 3;
      expected = (1 - smooth) * f / 8 + smooth * f;
    }
    EXPECT_NEAR(rope.inv_freq()[i], expected, 1e-12 * std::max(1.0, expected)) << i;
  }
  EXPECT_DOUBLE_EQ(rope.inv_freq()[0], 1.0);  // highest frequency untouched
}

// The model makes its RoPE tables once, for positions [0, kSharedRopePositions), and every step
// slices them; that is only the per-call computation if a row depends on its position alone --
// not on which other positions share the call (ATen's vector and scalar cos/sin could differ in
// the last float64 bit; the cast to the model's dtype must not show it).
TEST(RopeTest, ATableRowDependsOnlyOnItsPosition) {
  const auto positions = [](int64_t begin, int64_t n) {
    return at::arange(begin, begin + n, at::TensorOptions().dtype(at::kLong));
  };
  for (const auto& [config, head_dim] :
       {std::pair{RopeConfig{}, int64_t{8}}, {RopeConfig{}, 64}, {Llama3Rope(), 128}}) {
    RotaryEmbedding rope(config, head_dim);
    for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      const at::Tensor like = at::empty({0}, at::TensorOptions().dtype(dtype));
      const int64_t all = LlamaModel::kSharedRopePositions;
      auto [cos_all, sin_all] = rope.Tables(positions(0, all), like);
      for (const auto& [begin, n] : {std::pair<int64_t, int64_t>{0, 1},
                                     {5, 3},
                                     {129, 1},
                                     {0, 130},
                                     {17, 111},
                                     {1000, 7},
                                     {all - 9, 9}}) {
        auto [cos, sin] = rope.Tables(positions(begin, n), like);
        EXPECT_TRUE(at::equal(cos, cos_all.narrow(0, begin, n))) << head_dim << " " << begin;
        EXPECT_TRUE(at::equal(sin, sin_all.narrow(0, begin, n))) << head_dim << " " << begin;
      }
    }
  }
}

TEST(RopeTest, InvertUndoesApply) {
  RotaryEmbedding rope(RopeConfig{}, 64);
  at::Tensor x = at::randn({2, 9, 64}, at::kDouble);
  at::Tensor pos = at::arange(100, 109, at::TensorOptions().dtype(at::kLong));
  // Float64 rotation and its inverse: a few eps64 (2.2e-16) of |x| (< 6 for these normals).
  EXPECT_LE(testing::MaxRelDiff(rope.Invert(rope.Apply(x, pos), pos), x), 1e-12);
}

TEST(RuntimeTest, ProjectKeyValueReproducesCapturedKeysAndValues) {
  auto model = LoadShared("tinystories-4m");
  const std::vector<TokenId> tokens = testing::LoadGolden("tinystories-4m").prompts[2].ids;
  CaptureSpec spec = CaptureSpec::All(model->config());
  KvCache cache = model->NewCache(64);
  auto out = model->Forward(tokens, &cache, {.logits = LogitsMode::kNone, .capture = &spec});
  ASSERT_TRUE(out.ok());
  for (const auto& [layer, cap] : out->captures) {
    auto [k, v] = model->ProjectKeyValue(layer, cap.attn_input);
    EXPECT_LE(testing::MaxRelDiff(k, cap.key_prerope), kReordered);
    EXPECT_LE(testing::MaxRelDiff(v, cap.value), kReordered);
  }
}

TEST(RuntimeTest, RejectsBadTokensAndOverlongSequences) {
  auto model = LoadShared("llama2xs-260k");  // max_position_embeddings 256
  KvCache cache = model->NewCache(8);
  auto bad = model->Forward(Ids({1, 512}), &cache);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("outside the vocabulary"), std::string::npos);
  EXPECT_FALSE(model->Forward({}, &cache).ok());
  std::vector<TokenId> long_prompt(257, 5);
  auto too_long = model->Forward(long_prompt, &cache);
  EXPECT_EQ(too_long.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(too_long.status().message().find("max_position_embeddings (256)"), std::string::npos);
  EXPECT_EQ(cache.length(), 0);  // nothing half-written
  // Generation stops cleanly at the position limit instead of failing.
  GenerationOptions options;
  options.max_tokens = 100;
  options.ignore_eos = true;
  std::vector<TokenId> prompt(200, 5);
  auto result = GenerateTokens(*model, prompt, &cache, options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(FinishReasonName(result->finish_reason), "max_positions");
  EXPECT_EQ(result->output_ids.size(), 57u);
}

TEST(RuntimeTest, CapturingNothingCostsNothingAndChangesNothing) {
  auto model = LoadShared("stories260k");
  const std::vector<TokenId> tokens = testing::LoadGolden("stories260k").prompts[2].ids;
  CaptureSpec empty;
  KvCache a = model->NewCache(64), b = model->NewCache(64);
  auto plain = model->Forward(tokens, &a, {.logits = LogitsMode::kAll});
  auto with_empty = model->Forward(tokens, &b, {.logits = LogitsMode::kAll, .capture = &empty});
  ASSERT_TRUE(plain.ok() && with_empty.ok());
  EXPECT_TRUE(with_empty->captures.empty());
  EXPECT_TRUE(at::equal(plain->logits, with_empty->logits));
}

TEST(RuntimeTest, Bf16RunsOnCpuCloseToGolden) {
  LlamaModel::Options options;
  options.dtype = at::kBFloat16;
  auto model = LlamaModel::Load(testing::ModelDir("tinystories-4m"), options);
  ASSERT_TRUE(model.ok()) << model.status();
  testing::Golden golden = testing::LoadGolden("tinystories-4m");
  KvCache cache = (*model)->NewCache(64);
  auto out = (*model)->Forward(golden.prompts[2].ids, &cache, {.logits = LogitsMode::kAll});
  ASSERT_TRUE(out.ok()) << out.status();
  at::Tensor expected = golden.Tensor("p2.logits");
  // bf16 keeps ~3 significant digits; the argmax should almost always survive.
  double agree =
      (out->logits.argmax(-1) == expected.argmax(-1)).to(at::kDouble).mean().item<double>();
  EXPECT_GE(agree, 0.9);
  // bf16 rounds each stored value to 2^-8 relative; over a few layers and the LM head the
  // logits stay within a few percent of their magnitude.
  EXPECT_LE(testing::MaxRelDiff(out->logits, expected), 16 * 0.00390625);
}

}  // namespace
}  // namespace scd

namespace scd {
namespace {

// Decode steps with a per-sequence workspace slice the same RoPE tables as steps without one (the
// model's, made at load; RopeTest.ATableRowDependsOnlyOnItsPosition: as if made per call): the
// results are bit-identical.
TEST(DecodeWorkspaceTest, StepsWithAWorkspaceAreBitIdentical) {
  for (const char* name : {"stories260k", "tinystories-4m"}) {
    auto model = testing::Ok(LlamaModel::Load(testing::ModelDir(name), {}));
    const std::vector<TokenId> prompt = testing::LoadGolden(name).prompts[1].ids;
    const DecodeWorkspace workspace = model->NewWorkspace(prompt.size() + 12);
    KvCache plain = model->NewCache(64), reused = model->NewCache(64);
    auto a = model->Forward(prompt, &plain);
    auto b = model->Forward(prompt, &reused, {.workspace = &workspace});
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_TRUE(at::equal(a->logits, b->logits)) << name;
    for (int step = 0; step < 12; ++step) {
      const TokenId next[] = {static_cast<TokenId>(a->logits.argmax(-1).item<int64_t>())};
      a = model->Forward(next, &plain);
      b = model->Forward(next, &reused, {.workspace = &workspace});
      ASSERT_TRUE(a.ok() && b.ok());
      EXPECT_TRUE(at::equal(a->logits, b->logits)) << name << " step " << step;
    }
    // Past the workspace's capacity the step builds its own tables, still identically.
    for (int step = 0; step < 3; ++step) {
      const TokenId next[] = {7};
      a = model->Forward(next, &plain);
      b = model->Forward(next, &reused, {.workspace = &workspace});
      ASSERT_TRUE(a.ok() && b.ok());
      EXPECT_TRUE(at::equal(a->logits, b->logits)) << name;
    }
  }
}

// Single-row projections as GEMV instead of a one-row GEMM: the same sums in another order. Each
// output accumulates at most K = max(hidden, ffn) products, so logits agree to ~K eps32 of their
// magnitude per layer.
TEST(DecodeWorkspaceTest, GemvDecodeMatchesGemmDecode) {
  for (const char* name : {"stories260k", "tinystories-4m"}) {
    LlamaModel::Options options;
    options.skinny_rows = 0;  // BLAS only: GEMV against GEMM
    auto gemv = testing::Ok(LlamaModel::Load(testing::ModelDir(name), options));
    options.gemv_single_rows = false;
    auto gemm = testing::Ok(LlamaModel::Load(testing::ModelDir(name), options));
    const ModelConfig& c = gemv->config();
    const double bound = testing::kFloat32Epsilon *
                         static_cast<double>(std::max(c.hidden_size, c.intermediate_size)) *
                         static_cast<double>(c.num_layers);
    const std::vector<TokenId> prompt = testing::LoadGolden(name).prompts[1].ids;
    GenerationOptions generation;
    generation.max_tokens = 16;
    generation.ignore_eos = true;
    KvCache a = gemv->NewCache(64), b = gemm->NewCache(64);
    auto x = GenerateTokens(*gemv, prompt, &a, generation);
    auto y = GenerateTokens(*gemm, prompt, &b, generation);
    ASSERT_TRUE(x.ok() && y.ok());
    EXPECT_EQ(x->output_ids, y->output_ids) << name;
    const TokenId next[] = {x->output_ids.back()};
    auto lx = gemv->Forward(next, &a), ly = gemm->Forward(next, &b);
    ASSERT_TRUE(lx.ok() && ly.ok());
    EXPECT_LE(testing::MaxRelDiff(lx->logits, ly->logits), bound) << name;
  }
}

}  // namespace
}  // namespace scd

namespace scd {
namespace {

// A libtorch error inside a public entry point comes back as a status, never as an exception:
// tensors on the meta device have no data, and copying them out throws inside libtorch.
TEST(ExceptionBoundaryTest, LibtorchErrorsBecomeStatuses) {
  auto model = testing::Ok(LlamaModel::Load(testing::ModelDir("stories260k"), {}));
  const ModelConfig& c = model->config();
  at::Tensor meta =
      at::empty({c.num_kv_heads, 3, c.head_dim}, at::TensorOptions().device(at::kMeta));
  KvCache cache = model->NewCache(8);
  absl::Status s;
  EXPECT_NO_THROW(s = model->LoadPrefix(0, meta, meta, KeyFormat::kPreRope, &cache));
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(std::string(s.message()).find("LlamaModel::LoadPrefix"), std::string::npos) << s;
  at::Tensor hidden = at::empty({3, c.hidden_size}, at::TensorOptions().device(at::kMeta));
  absl::StatusOr<at::Tensor> out;
  EXPECT_NO_THROW(out = model->RunLayers(0, 1, hidden, &cache));
  EXPECT_FALSE(out.ok());
}

}  // namespace
}  // namespace scd
