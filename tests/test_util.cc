#include "tests/test_util.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

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

double MaxAbsDiff(const at::Tensor& a, const at::Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  if (a.sizes() != b.sizes()) return 1e30;
  return (a.to(at::kCPU, at::kDouble) - b.to(at::kCPU, at::kDouble)).abs().max().item<double>();
}

}  // namespace scd::testing
