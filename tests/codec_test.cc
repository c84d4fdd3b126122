// The codec's math against independent references: ridge least squares, reconstruction-error
// optimality, nested ranks, quantizer error bounds, exact byte accounting, and raw transfer
// between identical models reproducing native prefill.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "base/status_macros.h"
#include "codec/code_batch.h"
#include "codec/code_decoder.h"
#include "codec/code_encoder.h"
#include "codec/gram_stats.h"
#include "codec/quantize.h"
#include "codec/reuse_translator.h"
#include "tests/test_util.h"

namespace scd {
namespace {

namespace fs = std::filesystem;

at::Generator Gen(uint64_t seed) { return at::detail::createCPUGenerator(seed); }

// Correlated paired data: B depends linearly (plus noise) on A, A has a decaying spectrum.
std::pair<at::Tensor, at::Tensor> PairedData(int64_t n, int64_t da, int64_t db, uint64_t seed) {
  at::Generator g = Gen(seed);
  auto f64 = at::TensorOptions().dtype(at::kDouble);
  at::Tensor scales = at::pow(0.7, at::arange(da, f64));
  at::Tensor a = at::randn({n, da}, g, f64) * scales + at::randn({da}, g, f64);
  at::Tensor w = at::randn({da, db}, g, f64);
  at::Tensor b = a.mm(w) + 0.3 * at::randn({n, db}, g, f64) + 2.0;
  return {a, b};
}

GramStats Grams(const at::Tensor& a, const at::Tensor& b) {
  GramStats g(a.size(1), b.size(1));
  // Stream in chunks, as calibration does.
  for (int64_t i = 0; i < a.size(0); i += 97) {
    const int64_t n = std::min<int64_t>(97, a.size(0) - i);
    g.Add(a.narrow(0, i, n), b.narrow(0, i, n));
  }
  return g;
}

// ||B - (A - mu_a) W_enc W_dec - mu_b||^2 in float64 for a single-map translator.
double ReconstructionError(const ReuseTranslator& t, const at::Tensor& a, const at::Tensor& b) {
  at::Tensor x = t.Decode(t.Encode(a.to(at::kFloat), t.rank())).to(at::kDouble);
  return (b - x).pow(2).sum().item<double>();
}

TEST(ReuseTranslatorTest, FullRankRrrEqualsRidgeLeastSquares) {
  auto [a, b] = PairedData(3000, 6, 5, 1);
  const double ridge = 1e-2;
  auto t = ReuseTranslator::Fit({Grams(a, b)}, {FitMethod::kRrr, 5, 0.99, ridge});
  ASSERT_TRUE(t.ok()) << t.status();
  // Independent ridge solution: least squares on the augmented system [Ac; sqrt(l) I] W = [Bc; 0].
  at::Tensor ac = a - a.mean(0), bc = b - b.mean(0);
  const double lambda = ridge * ac.pow(2).sum().item<double>() / 6;
  at::Tensor aug_a = at::cat({ac, std::sqrt(lambda) * at::eye(6, ac.options())});
  at::Tensor aug_b = at::cat({bc, at::zeros({6, 5}, bc.options())});
  at::Tensor w_ridge = std::get<0>(at::linalg_lstsq(aug_a, aug_b));
  at::Tensor w = t->w_enc()[0].to(at::kDouble).mm(t->w_dec()[0].to(at::kDouble));
  EXPECT_LE((w - w_ridge).abs().max().item<double>(), 1e-5 * w_ridge.abs().max().item<double>());
  // Means are accumulated in float64 and rounded once to float32: a few eps32 of their size.
  EXPECT_LE(testing::MaxRelDiff(t->mu_a()[0], a.mean(0)), 8 * testing::kFloat32Epsilon);
  EXPECT_LE(testing::MaxRelDiff(t->mu_b()[0], b.mean(0)), 8 * testing::kFloat32Epsilon);
}

TEST(ReuseTranslatorTest, RrrNeverReconstructsWorseThanJointSvd) {
  for (uint64_t seed : {2, 3, 4}) {
    auto [a, b] = PairedData(4000, 8, 8, seed);
    GramStats g = Grams(a, b);
    for (int64_t r = 1; r <= 8; ++r) {
      auto rrr = ReuseTranslator::Fit({g}, {FitMethod::kRrr, r, 0.99, 1e-7});
      auto joint = ReuseTranslator::Fit({g}, {FitMethod::kJointSvd, r, 0.99, 1e-7});
      ASSERT_TRUE(rrr.ok() && joint.ok());
      const double e_rrr = ReconstructionError(*rrr, a, b);
      const double e_joint = ReconstructionError(*joint, a, b);
      EXPECT_LE(e_rrr, e_joint * (1 + 1e-5)) << "seed " << seed << " rank " << r;
    }
  }
}

TEST(ReuseTranslatorTest, RrrBeatsJointSvdOnRealKeyTraces) {
  // Pre-RoPE keys of layer 2 of the hard pair on real text.
  auto producer = testing::Ok(LlamaModel::Load(testing::ModelDir("stories260k"), {}));
  auto consumer = testing::Ok(LlamaModel::Load(testing::ModelDir("llama2xs-260k"), {}));
  CaptureSpec spec;
  spec.layers = {2};
  spec.key_prerope = true;
  at::Tensor a_rows, b_rows;
  std::vector<at::Tensor> as, bs;
  for (const auto& prompt : testing::LoadGolden("stories260k").prompts) {
    if (prompt.ids.size() < 8) continue;
    KvCache ca = producer->NewCache(64), cb = consumer->NewCache(64);
    auto oa = producer->Forward(prompt.ids, &ca, {.logits = LogitsMode::kNone, .capture = &spec});
    auto ob = consumer->Forward(prompt.ids, &cb, {.logits = LogitsMode::kNone, .capture = &spec});
    as.push_back(oa->captures[2].key_prerope.reshape({-1, 8}));
    bs.push_back(ob->captures[2].key_prerope.reshape({-1, 8}));
  }
  at::Tensor a = at::cat(as).to(at::kDouble), b = at::cat(bs).to(at::kDouble);
  GramStats g = Grams(a, b);
  for (int64_t r = 1; r <= 8; ++r) {
    const double e_rrr =
        ReconstructionError(*ReuseTranslator::Fit({g}, {FitMethod::kRrr, r, 0.99, 1e-7}), a, b);
    const double e_joint = ReconstructionError(
        *ReuseTranslator::Fit({g}, {FitMethod::kJointSvd, r, 0.99, 1e-7}), a, b);
    EXPECT_LE(e_rrr, e_joint * (1 + 1e-5)) << "rank " << r;
  }
}

TEST(ReuseTranslatorTest, NestedRanksDecodeAsLowerRankCodes) {
  auto [a, b] = PairedData(2000, 8, 8, 5);
  GramStats g = Grams(a, b);
  for (FitMethod method : {FitMethod::kRrr, FitMethod::kJointSvd, FitMethod::kPca}) {
    auto full = ReuseTranslator::Fit({g}, {method, 6, 0.99, 1e-4});
    ASSERT_TRUE(full.ok());
    at::Tensor x = a.to(at::kFloat).narrow(0, 0, 50);
    at::Tensor z6 = full->Encode(x, 6);
    // Error bounds of the two float32 paths (the BLAS kernel blocks a GEMM of 6 code columns
    // differently from one of r, so they agree only to rounding). Encode: z = (x - mu_a) W_enc,
    // d_in = 8 products per code, each path within gamma_8 |x - mu_a| |W_enc| of the exact z.
    // Decode: y = z W_dec + mu_b, r products plus the bias: gamma_{r+1} (|z| |W_dec| + |mu_b|),
    // and the codes' own difference carried through |W_dec|. Both paths err, hence the 2s.
    const at::Tensor xc = (x - full->mu_a()[0]).abs().to(at::kDouble);
    const at::Tensor enc_abs = full->w_enc()[0].abs().to(at::kDouble);
    const at::Tensor dec_abs = full->w_dec()[0].abs().to(at::kDouble);
    const at::Tensor mu_b_abs = full->mu_b()[0].abs().to(at::kDouble);
    const double tiny = 1e-30;  // keeps a bound positive where every term is exactly zero
    for (int64_t r = 1; r < 6; ++r) {
      auto direct = ReuseTranslator::Fit({g}, {method, r, 0.99, 1e-4});
      at::Tensor from_truncated_code = full->Decode(z6.narrow(-1, 0, r));
      const at::Tensor code_bound =
          2 * testing::Float32Gamma(8) * xc.mm(enc_abs.narrow(1, 0, r)) + tiny;
      const at::Tensor dec_r = dec_abs.narrow(0, 0, r);
      const at::Tensor z_abs = z6.narrow(-1, 0, r).abs().to(at::kDouble);
      const at::Tensor decode_bound =
          code_bound.mm(dec_r) + 2 * testing::Float32Gamma(r + 1) * (z_abs.mm(dec_r) + mu_b_abs) +
          tiny;
      EXPECT_LE(testing::MaxBoundRatio(z6.narrow(-1, 0, r), full->Encode(x, r), code_bound), 1.0)
          << FitMethodName(method) << " rank " << r;
      EXPECT_LE(testing::MaxBoundRatio(from_truncated_code,
                                       full->Truncated(r).Decode(full->Encode(x, r)), decode_bound),
                1.0)
          << FitMethodName(method) << " rank " << r;
      // A rank-r fit is the rank-6 fit truncated (up to eigenvector signs).
      EXPECT_LE(
          (from_truncated_code - direct->Decode(direct->Encode(x, r))).abs().max().item<double>(),
          1e-3 * x.abs().max().item<double>())
          << FitMethodName(method) << " rank " << r;
    }
  }
}

TEST(ReuseTranslatorTest, PerHeadMapsKeepHeadsApart) {
  // Head 0 maps B = 2A, head 1 maps B = -A: one shared map cannot do both, per-head maps can.
  at::Generator gen = Gen(6);
  at::Tensor a = at::randn({2, 500, 4}, gen);
  at::Tensor b = at::stack({2 * a[0], -a[1]});
  std::vector<GramStats> per_head;
  for (int h = 0; h < 2; ++h) per_head.push_back(Grams(a[h], b[h]));
  auto t = ReuseTranslator::Fit(per_head, {FitMethod::kRrr, 4, 0.99, 1e-8});
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(t->per_head());
  at::Tensor z = t->Encode(a, 4);
  EXPECT_EQ(z.sizes(), (std::vector<int64_t>{2, 500, 4}));
  // Exact maps up to the ridge (1e-8 of the input variance) and float32 rounding.
  EXPECT_LE(testing::MaxRelDiff(t->Decode(z), b), 1e-4);
  GramStats shared(4, 4);
  for (const GramStats& g : per_head) shared.Merge(g);
  auto s = ReuseTranslator::Fit({shared}, {FitMethod::kRrr, 4, 0.99, 1e-8});
  EXPECT_GT((s->Decode(s->Encode(a, 4)) - b).abs().max().item<double>(), 0.5);
}

TEST(ReuseTranslatorTest, EnergyPicksTheSmallestSufficientRank) {
  EXPECT_EQ(RankForEnergy({5, 3, 1, 1}, 0.5), 1);
  EXPECT_EQ(RankForEnergy({5, 3, 1, 1}, 0.8), 2);
  EXPECT_EQ(RankForEnergy({5, 3, 1, 1}, 0.95), 4);
  auto [a, b] = PairedData(2000, 8, 8, 7);
  auto t = ReuseTranslator::Fit({Grams(a, b)}, {FitMethod::kRrr, 0, 0.9, 1e-4});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->rank(), RankForEnergy(t->spectrum()[0], 0.9));
  EXPECT_LT(t->rank(), 8);
}

TEST(QuantizeTest, Int4RoundTripWithinItsBound) {
  at::Generator gen = Gen(8);
  for (double scale : {1e-3, 1.0, 300.0}) {
    at::Tensor x = at::randn({3, 37, 8}, gen) * scale + scale;  // 888 values: a short last group
    QuantizedInt4 q = QuantizeInt4Groups(x);
    const int64_t groups = (x.numel() + 31) / 32;
    EXPECT_EQ(q.scale_zero.sizes(), (std::vector<int64_t>{groups, 2}));
    EXPECT_EQ(q.packed.numel(), (x.numel() + 1) / 2);
    at::Tensor y = DequantizeInt4Groups(q.packed, q.scale_zero, x.numel()).reshape(x.sizes());
    at::Tensor flat_err = (y - x).abs().reshape({-1});
    at::Tensor sz = q.scale_zero.to(at::kFloat);
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t n = std::min<int64_t>(32, x.numel() - g * 32);
      const double bound =
          0.5 * sz[g][0].item<double>() + std::abs(sz[g][1].item<double>()) / 1024 + 1e-6 * scale;
      EXPECT_LE(flat_err.narrow(0, g * 32, n).max().item<double>(), bound) << "group " << g;
    }
  }
}

TEST(QuantizeTest, Int8RowsWithinHalfAStep) {
  at::Generator gen = Gen(9);
  at::Tensor x = at::randn({4, 50, 12}, gen) * at::rand({4, 50, 1}, gen) * 10;
  QuantizedInt8 q = QuantizeInt8Rows(x);
  EXPECT_EQ(q.scales.numel(), 200);
  at::Tensor y = DequantizeInt8Rows(q.values, q.scales);
  at::Tensor err = (y - x).abs().reshape({-1, 12}).amax(1);
  EXPECT_TRUE((err <= q.scales.to(at::kFloat) * 0.5 + 1e-6).all().item<bool>());
}

TEST(CodeBatchTest, ByteCountsAreExact) {
  at::Tensor codes = at::randn({4, 10, 3});
  EXPECT_EQ(PackTensor(codes, WireDtype::kF16).bytes(), 4 * 10 * 3 * 2);
  EXPECT_EQ(PackTensor(codes, WireDtype::kF32).bytes(), 4 * 10 * 3 * 4);
  EXPECT_EQ(PackTensor(codes, WireDtype::kInt8).bytes(),
            4 * 10 * 3 + 4 * 10 * 2);                                  // + f16 scale per row
  EXPECT_EQ(PackTensor(codes, WireDtype::kInt4).bytes(), 60 + 4 * 4);  // 120 values: 4 groups
  for (WireDtype d :
       {WireDtype::kF32, WireDtype::kF16, WireDtype::kBF16, WireDtype::kInt8, WireDtype::kInt4}) {
    CodeChunk c = PackTensor(codes, d);
    absl::StatusOr<at::Tensor> unpacked = UnpackTensor(c, at::kCPU);
    ASSERT_TRUE(unpacked.ok()) << unpacked.status();
    EXPECT_EQ(unpacked->sizes(), codes.sizes()) << WireDtypeName(d);
  }
}

TEST(CodeBatchTest, ScdPayloadMatchesTheFormula) {
  auto model = testing::Ok(LlamaModel::Load(testing::ModelDir("stories260k"), {}));
  Artifact artifact = testing::SyntheticArtifact(*model);
  const std::vector<TokenId> prefix = testing::LoadGolden("stories260k").prompts[2].ids;
  const int64_t T = static_cast<int64_t>(prefix.size());
  for (WireDtype dtype : {WireDtype::kF16, WireDtype::kInt8, WireDtype::kInt4}) {
    TransferOptions options;
    options.code_dtype = dtype;
    auto plan =
        testing::Ok(TransferPlan::Make(TransferMode::kScd, model->config(), &artifact, options));
    CodeEncoder encoder(plan, &artifact, options);
    auto batch = testing::Ok(encoder.Prefill(*model, prefix));
    if (dtype == WireDtype::kInt4) {
      // Per chunk of n values: ceil(n / 2) bytes and an f16 scale and zero per 32-value group.
      auto int4 = [](int64_t n) { return (n + 1) / 2 + (n + 31) / 32 * 4; };
      EXPECT_EQ(batch.bytes(), 3 * (int4(4 * T * 2) + int4(4 * T * 3)) + 2 * int4(T * 5));
      EXPECT_EQ(batch.BytesPerLayer().at(1), int4(T * 5));
      continue;
    }
    // method.md: T * [sum_reuse H_kv (r_K + r_V) + sum_patch r_H] * bytes per element
    // (+ for int8 one f16 scale per code row: H_kv rows per K and per V code, one per H code).
    const int64_t elements = T * (3 * 4 * (2 + 3) + 2 * 5);
    const int64_t expected =
        dtype == WireDtype::kF16 ? 2 * elements : elements + 2 * T * (3 * 4 * 2 + 2);
    EXPECT_EQ(batch.bytes(), expected) << WireDtypeName(dtype);
    EXPECT_EQ(batch.BytesPerLayer().at(1), dtype == WireDtype::kF16 ? 2 * T * 5 : T * 5 + 2 * T);
  }
  // Raw: 2 (K, V) x layers x kv_dim x 2 bytes per token; int4 ~ 4.5 bits a value.
  for (TransferMode mode : {TransferMode::kRaw, TransferMode::kInt4}) {
    auto plan = testing::Ok(TransferPlan::Make(mode, model->config(), nullptr, {}));
    CodeEncoder encoder(plan, nullptr, {});
    auto batch = testing::Ok(encoder.Prefill(*model, prefix));
    const int64_t values_per_tensor = 4 * T * 8;
    const int64_t expected =
        mode == TransferMode::kRaw
            ? model->config().KvBytesPerToken(2) * T
            : 10 * ((values_per_tensor + 1) / 2 + (values_per_tensor + 31) / 32 * 4);
    EXPECT_EQ(batch.bytes(), expected) << TransferModeName(mode);
  }
}

// Layer-wise encoding (what the producer streams while its prefill runs) yields exactly the
// batch's chunks, bit for bit, for every mode that sends codes.
TEST(CodeEncoderTest, LayerByLayerDuringPrefillEqualsWholeBatch) {
  auto model = testing::Ok(LlamaModel::Load(testing::ModelDir("stories260k"), {}));
  Artifact artifact = testing::SyntheticArtifact(*model);
  const std::vector<TokenId> prefix = testing::LoadGolden("stories260k").prompts[2].ids;
  const int64_t T = static_cast<int64_t>(prefix.size());
  for (TransferMode mode : {TransferMode::kRaw, TransferMode::kInt4, TransferMode::kRecompute,
                            TransferMode::kReuse, TransferMode::kScd}) {
    TransferOptions options;
    options.recompute_layers = {2, 3};
    const Artifact* used = ModeNeedsArtifact(mode) ? &artifact : nullptr;
    auto plan = testing::Ok(TransferPlan::Make(mode, model->config(), used, options));
    CodeEncoder encoder(plan, used, options);
    CodeBatch whole = testing::Ok(encoder.Prefill(*model, prefix));

    std::vector<CodeChunk> streamed;
    std::vector<int> layers_seen;
    KvCache cache = model->NewCache(T);
    ForwardOptions forward{.logits = LogitsMode::kNone, .capture = &plan.capture};
    forward.on_layer = [&](int layer, LayerCapture capture) -> absl::Status {
      layers_seen.push_back(layer);
      SCD_ASSIGN_OR_RETURN(std::vector<CodeChunk> chunks, encoder.EncodeLayer(layer, capture, T));
      for (CodeChunk& chunk : chunks) streamed.push_back(std::move(chunk));
      return absl::OkStatus();
    };
    ASSERT_TRUE(model->Forward(prefix, &cache, forward).ok());
    EXPECT_EQ(layers_seen.size(), static_cast<size_t>(model->config().num_layers));
    auto key = [](const CodeChunk& c) { return std::make_pair(c.layer, static_cast<int>(c.kind)); };
    auto by_key = [&](const CodeChunk& a, const CodeChunk& b) { return key(a) < key(b); };
    // Streamed chunks come in layer order already.
    EXPECT_TRUE(
        std::is_sorted(streamed.begin(), streamed.end(),
                       [](const CodeChunk& a, const CodeChunk& b) { return a.layer < b.layer; }));
    std::vector<CodeChunk> expected = whole.chunks;
    std::stable_sort(expected.begin(), expected.end(), by_key);
    std::stable_sort(streamed.begin(), streamed.end(), by_key);
    ASSERT_EQ(streamed.size(), expected.size()) << TransferModeName(mode);
    ASSERT_FALSE(expected.empty()) << TransferModeName(mode);
    for (size_t i = 0; i < expected.size(); ++i) {
      testing::ExpectSameChunk(streamed[i], expected[i], TransferModeName(mode));
    }
  }
  // A capture missing what the plan needs is an error, not a crash.
  auto plan = testing::Ok(TransferPlan::Make(TransferMode::kRaw, model->config(), nullptr, {}));
  EXPECT_EQ(CodeEncoder(plan, nullptr, {}).EncodeLayer(0, LayerCapture(), T).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CodeEncoder(plan, nullptr, {}).EncodeLayer(99, LayerCapture(), T).status().code(),
            absl::StatusCode::kInvalidArgument);
}

at::Tensor ContinuationLogits(const LlamaModel& model, KvCache* cache,
                              const std::vector<TokenId>& tokens) {
  auto out = model.Forward(tokens, cache, {.logits = LogitsMode::kAll});
  EXPECT_TRUE(out.ok()) << out.status();
  return out->logits;
}

// A cache rebuilt from f32 captures feeds the same numbers through attention as the native one;
// only the order of some float32 sums differs (cache slices vs fused projections): logits agree
// to a few dozen eps32 of their magnitude.
constexpr double kReorderedLogits = 64 * testing::kFloat32Epsilon;

TEST(TransferTest, RawModeBetweenIdenticalModelsReproducesNativePrefill) {
  for (const char* name : {"stories260k", "tinystories-4m"}) {
    auto model = testing::Ok(LlamaModel::Load(testing::ModelDir(name), {}));
    const std::vector<TokenId> seq = testing::LoadGolden(name).prompts[2].ids;
    const std::vector<TokenId> prefix(seq.begin(), seq.end() - 6), rest(seq.end() - 6, seq.end());
    KvCache native = model->NewCache(64);
    ASSERT_TRUE(model->Forward(prefix, &native, {.logits = LogitsMode::kNone}).ok());
    at::Tensor expected = ContinuationLogits(*model, &native, rest);
    TransferOptions options;
    options.raw_dtype = WireDtype::kF32;  // exactness of capture -> transfer -> rebuild -> RoPE
    auto plan =
        testing::Ok(TransferPlan::Make(TransferMode::kRaw, model->config(), nullptr, options));
    CodeEncoder encoder(plan, nullptr, options);
    CodeDecoder decoder(*model, nullptr);
    auto batch = testing::Ok(encoder.Prefill(*model, prefix));
    KvCache rebuilt = model->NewCache(64);
    ASSERT_TRUE(decoder.Decode(batch, prefix, &rebuilt).ok());
    EXPECT_LE(testing::MaxRelDiff(ContinuationLogits(*model, &rebuilt, rest), expected),
              kReorderedLogits)
        << name;
    // Local and recompute-everything-from-layer-0 are exact too.
    for (TransferMode mode : {TransferMode::kLocal, TransferMode::kRecompute}) {
      TransferOptions o = options;
      o.recompute_layers = {0, 1, 2, 3, 4};
      auto p = testing::Ok(TransferPlan::Make(mode, model->config(), nullptr, o));
      auto b = testing::Ok(CodeEncoder(p, nullptr, o).Prefill(*model, prefix));
      KvCache c = model->NewCache(64);
      ASSERT_TRUE(decoder.Decode(b, prefix, &c).ok());
      EXPECT_LE(testing::MaxRelDiff(ContinuationLogits(*model, &c, rest), expected),
                kReorderedLogits)
          << name << " " << TransferModeName(mode);
    }
  }
}

TEST(TransferTest, RecomputeSegmentsFromTheProducersResidualStream) {
  // Identical models: recomputing layers 2-3 from the transferred residual is exact as well.
  auto model = testing::Ok(LlamaModel::Load(testing::ModelDir("stories260k"), {}));
  const std::vector<TokenId> seq = testing::LoadGolden("stories260k").prompts[3].ids;
  const std::vector<TokenId> prefix(seq.begin(), seq.end() - 4), rest(seq.end() - 4, seq.end());
  KvCache native = model->NewCache(64);
  ASSERT_TRUE(model->Forward(prefix, &native, {.logits = LogitsMode::kNone}).ok());
  at::Tensor expected = ContinuationLogits(*model, &native, rest);
  TransferOptions options;
  options.raw_dtype = WireDtype::kF32;
  options.recompute_layers = {2, 3};
  auto plan =
      testing::Ok(TransferPlan::Make(TransferMode::kRecompute, model->config(), nullptr, options));
  ASSERT_EQ(plan.segments.size(), 1u);
  auto batch = testing::Ok(CodeEncoder(plan, nullptr, options).Prefill(*model, prefix));
  KvCache rebuilt = model->NewCache(64);
  ASSERT_TRUE(CodeDecoder(*model, nullptr).Decode(batch, prefix, &rebuilt).ok());
  EXPECT_LE(testing::MaxRelDiff(ContinuationLogits(*model, &rebuilt, rest), expected),
            kReorderedLogits);
}

TEST(TransferTest, KeysAreRotatedWithTheConsumersRopeConfig) {
  // The consumer is stories260k with rope_theta 1e6; the producer the original (1e4).
  testing::TempDir dir;
  const std::string src = testing::ModelDir("stories260k");
  for (const char* f : {"model.safetensors", "tokenizer.json"}) {
    fs::copy_file(src + "/" + f, dir.File(f));
  }
  std::string config = testing::ReadFile(src + "/config.json");
  config.replace(config.find("\"rope_theta\": 10000.0"), 21, "\"rope_theta\": 1000000.0");
  testing::WriteFile(dir.File("config.json"), config);
  auto producer = testing::Ok(LlamaModel::Load(src, {}));
  auto consumer = testing::Ok(LlamaModel::Load(dir.path(), {}));
  ASSERT_EQ(consumer->config().rope.theta, 1e6);
  const std::vector<TokenId> prefix = testing::LoadGolden("stories260k").prompts[2].ids;
  TransferOptions options;
  options.raw_dtype = WireDtype::kF32;
  auto plan =
      testing::Ok(TransferPlan::Make(TransferMode::kRaw, producer->config(), nullptr, options));
  auto batch = testing::Ok(CodeEncoder(plan, nullptr, options).Prefill(*producer, prefix));
  KvCache rebuilt = consumer->NewCache(64);
  ASSERT_TRUE(CodeDecoder(*consumer, nullptr).Decode(batch, prefix, &rebuilt).ok());
  // Layer 0's pre-RoPE keys depend only on the (shared) embeddings, so rotated with the
  // consumer's theta they must equal the consumer's own layer-0 keys, not the producer's.
  KvCache consumer_native = consumer->NewCache(64), producer_native = producer->NewCache(64);
  ASSERT_TRUE(consumer->Forward(prefix, &consumer_native, {.logits = LogitsMode::kNone}).ok());
  ASSERT_TRUE(producer->Forward(prefix, &producer_native, {.logits = LogitsMode::kNone}).ok());
  // Two RoPE implementations (per-step tables vs Apply): their float32 angles differ by ~p ulps
  // at position p, so keys agree to ~(positions + a few) eps32 of their magnitude.
  const double rope_bound = testing::kFloat32Epsilon * static_cast<double>(prefix.size() + 8);
  EXPECT_LE(testing::MaxRelDiff(rebuilt.keys(0), consumer_native.keys(0)), rope_bound);
  EXPECT_GT(testing::MaxRelDiff(rebuilt.keys(0), producer_native.keys(0)), 1e-2);
}

TEST(TransferTest, DecoderRejectsInconsistentBatches) {
  auto model = testing::Ok(LlamaModel::Load(testing::ModelDir("stories260k"), {}));
  const std::vector<TokenId> prefix = testing::LoadGolden("stories260k").prompts[2].ids;
  auto plan = testing::Ok(TransferPlan::Make(TransferMode::kRaw, model->config(), nullptr, {}));
  CodeBatch batch = testing::Ok(CodeEncoder(plan, nullptr, {}).Prefill(*model, prefix));
  CodeDecoder decoder(*model, nullptr);
  {
    CodeBatch b = batch;
    b.chunks.erase(b.chunks.begin() + 1);  // layer 0 value
    KvCache c = model->NewCache(64);
    absl::Status s = decoder.Decode(b, prefix, &c);
    EXPECT_NE(std::string(s.message()).find("layer 0 has keys or values, not both"),
              std::string::npos)
        << s;
  }
  {
    CodeBatch b = batch;
    b.chunks.resize(2);  // only layer 0: the rest has nothing to rebuild from
    KvCache c = model->NewCache(64);
    absl::Status s = decoder.Decode(b, prefix, &c);
    EXPECT_NE(std::string(s.message()).find("no payload and no hidden state"), std::string::npos)
        << s;
  }
  {
    KvCache c = model->NewCache(64);
    EXPECT_FALSE(decoder.Decode(batch, absl::MakeConstSpan(prefix).first(3), &c).ok());
  }
  auto scd = TransferPlan::Make(TransferMode::kScd, model->config(), nullptr, {});
  EXPECT_EQ(scd.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(ParseTransferMode("zip").ok());
  EXPECT_EQ(ParseTransferModes("raw, scd,raw")->size(), 2u);
}

// A request's mode: "" and "auto" are auto, a value of its own (never a transfer mode); every
// transfer mode's name reads back as itself; anything else is refused, naming the choices.
TEST(TransferModeTest, RequestedModesParseOnlyAtTheEdge) {
  for (const std::string name : {"", "auto"}) {
    absl::StatusOr<RequestedMode> mode = ParseRequestedMode(name);
    ASSERT_TRUE(mode.ok()) << name;
    EXPECT_TRUE(mode->is_auto());
    EXPECT_EQ(RequestedModeName(*mode), "auto");
    for (TransferMode m : kAllTransferModes) EXPECT_FALSE(mode->Is(m));
  }
  for (TransferMode m : kAllTransferModes) {
    absl::StatusOr<RequestedMode> mode = ParseRequestedMode(TransferModeName(m));
    ASSERT_TRUE(mode.ok()) << TransferModeName(m);
    EXPECT_FALSE(mode->is_auto());
    EXPECT_TRUE(mode->Is(m));
    EXPECT_EQ(*mode, RequestedMode(m));
    EXPECT_NE(*mode, RequestedMode::Auto());
    EXPECT_EQ(RequestedModeName(*mode), TransferModeName(m));
    EXPECT_EQ(TransferModeOr(TransferModeName(m), TransferMode::kRaw), m);
  }
  absl::StatusOr<RequestedMode> bad = ParseRequestedMode("telepathy");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("auto, local, raw, int4, recompute, reuse, scd"),
            std::string::npos);
  EXPECT_FALSE(ParseRequestedMode("AUTO").ok());
  EXPECT_EQ(TransferModeOr("telepathy", TransferMode::kLocal), TransferMode::kLocal);
}

}  // namespace
}  // namespace scd
