#include "tests/test_util.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace scd::testing {

std::string SharedDir() {
  const char* env = std::getenv("SCD_SHARED_DIR");
  return env != nullptr && *env != '\0' ? std::string(env) : std::string(SCD_SHARED_DIR);
}

std::string ModelDir(const std::string& name) { return SharedDir() + "/models/" + name; }
std::string BuildDir() { return SCD_BUILD_DIR; }

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

TempDir::TempDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "scd_test_XXXXXX").string();
  char* made = ::mkdtemp(pattern.data());
  EXPECT_NE(made, nullptr);
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

void WriteFile(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << contents;
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

CommandResult RunCommand(const std::string& command) {
  TempDir dir;
  const std::string out_path = dir.File("out"), err_path = dir.File("err");
  const std::string full = command + " >" + out_path + " 2>" + err_path + " </dev/null";
  int status = std::system(full.c_str());
  CommandResult r;
  if (WIFEXITED(status)) {
    r.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    r.signal = WTERMSIG(status);
  }
  r.out = ReadFile(out_path);
  r.err = ReadFile(err_path);
  return r;
}

}  // namespace scd::testing
