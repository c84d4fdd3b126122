#include "tests/test_util.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cstdlib>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "model/runtime.h"

namespace scd::testing {

const std::vector<std::string>& GoldenModelNames() {
  static const std::vector<std::string> names = {
      "stories260k",    "stories260k-fables",    "llama2xs-260k",   "tinystories-656k",
      "tinystories-4m", "tinystories-4m-fables", "tinystories-4m-b"};
  return names;
}

at::Tensor Golden::Tensor(const std::string& name) const {
  auto t = tensors->Load(name, at::kFloat);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *t : at::Tensor();
}

Golden LoadGolden(const std::string& model_name) {
  Golden g;
  g.model = model_name;
  const std::string base = SharedDir() + "/golden/" + model_name;
  nlohmann::json j = nlohmann::json::parse(ReadFile(base + ".json"));
  for (const auto& p : j["prompts"]) {
    GoldenPrompt prompt;
    prompt.text = p["text"].get<std::string>();
    prompt.ids = p["ids"].get<std::vector<TokenId>>();
    prompt.greedy_40 = p["greedy_40"].get<std::vector<TokenId>>();
    g.prompts.push_back(std::move(prompt));
  }
  auto file = SafetensorsFile::Open(base + ".safetensors");
  EXPECT_TRUE(file.ok()) << file.status();
  if (file.ok()) g.tensors = std::move(*file);
  return g;
}

std::vector<TokenId> GoldenContinuation(const std::string& model_name, int index, size_t length) {
  const GoldenPrompt golden = LoadGolden(model_name).prompts[static_cast<size_t>(index)];
  std::vector<TokenId> ids = golden.ids;
  ids.insert(ids.end(), golden.greedy_40.begin(), golden.greedy_40.end());
  ids.resize(std::min(ids.size(), length));
  return ids;
}

absl::StatusOr<c10::Device> TestDevice() {
  const char* name = std::getenv("SCD_TEST_DEVICE");
  return ParseDevice(name != nullptr && *name != '\0' ? name : "cpu");
}

double MaxAbsDiff(const at::Tensor& a, const at::Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  if (a.sizes() != b.sizes()) return 1e30;
  return (a.to(at::kCPU, at::kDouble) - b.to(at::kCPU, at::kDouble)).abs().max().item<double>();
}

double MaxRelDiff(const at::Tensor& actual, const at::Tensor& expected) {
  EXPECT_EQ(actual.sizes(), expected.sizes());
  if (actual.sizes() != expected.sizes()) return 1e30;
  at::Tensor e = expected.to(at::kCPU, at::kDouble);
  const double diff = (actual.to(at::kCPU, at::kDouble) - e).abs().max().item<double>();
  const double scale = e.numel() > 0 ? e.abs().max().item<double>() : 0.0;
  return scale > 0 ? diff / scale : diff;
}

double Float32Gamma(int64_t n) {
  const double u = kFloat32Epsilon / 2;
  return static_cast<double>(n) * u / (1 - static_cast<double>(n) * u);
}

double MaxBoundRatio(const at::Tensor& actual, const at::Tensor& expected,
                     const at::Tensor& bound) {
  EXPECT_EQ(actual.sizes(), expected.sizes());
  if (actual.sizes() != expected.sizes()) return 1e30;
  at::Tensor b = bound.to(at::kCPU, at::kDouble);
  EXPECT_TRUE((b > 0).all().item<bool>()) << "an error bound must be positive";
  at::Tensor diff = (actual.to(at::kCPU, at::kDouble) - expected.to(at::kCPU, at::kDouble)).abs();
  return (diff / b).max().item<double>();
}

Artifact SyntheticArtifact(const LlamaModel& model) {
  at::Generator gen = at::detail::createCPUGenerator(10);
  const ModelConfig& c = model.config();
  Artifact a;
  a.producer = testing::Ok(ModelIdentity::Of(model));
  a.consumer = a.producer;
  auto translator = [&](int64_t maps, int64_t din, int64_t r, int64_t dout) {
    return *ReuseTranslator::FromTensors(at::randn({maps, din}, gen), at::randn({maps, dout}, gen),
                                         at::randn({maps, din, r}, gen),
                                         at::randn({maps, r, dout}, gen));
  };
  for (int l = 0; l < c.num_layers; ++l) {
    ArtifactLayer layer;
    layer.key = translator(c.num_kv_heads, c.head_dim, 2, c.head_dim);
    layer.value = translator(c.num_kv_heads, c.head_dim, 3, c.head_dim);
    if (l == 1 || l == 3) {
      layer.route = LayerRoute::kPatch;
      layer.patch =
          *PatchAligner::Create(translator(1, c.hidden_size, 5, c.hidden_size), at::ones({5}),
                                {at::randn({7, 5}, gen), at::randn({c.hidden_size, 7}, gen)},
                                {at::randn({7}, gen), at::randn({c.hidden_size}, gen)});
    }
    a.layers.push_back(std::move(layer));
  }
  a.recompute_layers = {2, 3};
  return a;
}

void ExpectSameCache(const KvCache& a, const KvCache& b, const std::string& where) {
  ASSERT_EQ(a.num_layers(), b.num_layers()) << where;
  for (int l = 0; l < a.num_layers(); ++l) {
    ASSERT_EQ(a.length(l), b.length(l)) << where << " layer " << l;
    EXPECT_TRUE(at::equal(a.keys(l), b.keys(l))) << where << " keys of layer " << l;
    EXPECT_TRUE(at::equal(a.values(l), b.values(l))) << where << " values of layer " << l;
  }
}

void ExpectSameChunk(const CodeChunk& a, const CodeChunk& b, const std::string& where) {
  EXPECT_EQ(a.layer, b.layer) << where;
  EXPECT_EQ(a.kind, b.kind) << where;
  EXPECT_EQ(a.dtype, b.dtype) << where;
  EXPECT_EQ(a.token_begin, b.token_begin) << where;
  EXPECT_EQ(a.token_end, b.token_end) << where;
  EXPECT_EQ(a.shape, b.shape) << where;
  ASSERT_EQ(a.data.scalar_type(), b.data.scalar_type()) << where;
  EXPECT_TRUE(at::equal(a.data.reshape({-1}), b.data.reshape({-1}))) << where;  // bit-exact
  ASSERT_EQ(a.scales.defined(), b.scales.defined()) << where;
  if (a.scales.defined()) {
    EXPECT_TRUE(at::equal(a.scales.reshape({-1}), b.scales.reshape({-1}))) << where;
  }
  EXPECT_EQ(a.bytes(), b.bytes()) << where;
}

}  // namespace scd::testing
