// Loading checkpoints: sharded and bf16/f16 safetensors written here round-trip, tied embeddings
// under either name, and every malformed input yields a clear error instead of a crash.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "model/checkpoint.h"
#include "model/config.h"
#include "model/llama_model.h"
#include "model/safetensors.h"
#include "tests/test_util.h"

namespace scd {
namespace {

namespace fs = std::filesystem;
using testing::ReadFile;
using testing::TempDir;
using testing::WriteFile;

bool Contains(const absl::Status& s, const std::string& text) {
  return std::string(s.message()).find(text) != std::string::npos;
}

std::map<std::string, at::Tensor> LoadAll(const std::string& dir) {
  auto ckpt = testing::Ok(Checkpoint::Open(dir));
  std::map<std::string, at::Tensor> out;
  for (const std::string& name : ckpt->names()) {
    out[name] = testing::Ok(ckpt->Load(name, at::kFloat));
  }
  return out;
}

at::Tensor PromptLogits(const std::string& dir, const std::vector<TokenId>& ids) {
  auto model = LlamaModel::Load(dir, {});
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return at::Tensor();
  KvCache cache = (*model)->NewCache(64);
  return testing::Ok((*model)->Forward(ids, &cache, {.logits = LogitsMode::kAll})).logits;
}

void CopyConfig(const std::string& from_model, const TempDir& to) {
  fs::copy_file(testing::ModelDir(from_model) + "/config.json", to.File("config.json"));
}

// Writes a raw safetensors file from a header string and a data blob.
void WriteRaw(const std::string& path, const std::string& header, const std::string& data) {
  std::string bytes(8, '\0');
  uint64_t n = header.size();
  std::memcpy(bytes.data(), &n, 8);
  WriteFile(path, bytes + header + data);
}

TEST(SafetensorsTest, ShardedCheckpointRoundTripsExactly) {
  const std::string name = "stories260k";
  std::map<std::string, at::Tensor> tensors = LoadAll(testing::ModelDir(name));
  TempDir dir;
  CopyConfig(name, dir);
  // Three shards, tensors dealt round-robin, plus the index HF writes.
  SafetensorsWriter shards[3];
  nlohmann::json index;
  index["metadata"]["total_size"] = 0;
  int i = 0;
  for (const auto& [tensor_name, t] : tensors) {
    const std::string shard = "model-0000" + std::to_string(i % 3 + 1) + "-of-00003.safetensors";
    ASSERT_TRUE(shards[i % 3].Add(tensor_name, t).ok());
    index["weight_map"][tensor_name] = shard;
    ++i;
  }
  for (int s = 0; s < 3; ++s) {
    ASSERT_TRUE(shards[s]
                    .Write(dir.File("model-0000" + std::to_string(s + 1) + "-of-00003.safetensors"))
                    .ok());
  }
  WriteFile(dir.File("model.safetensors.index.json"), index.dump());
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_TRUE((*ckpt)->sharded());
  EXPECT_EQ((*ckpt)->names().size(), tensors.size());
  for (const auto& [tensor_name, t] : tensors) {
    EXPECT_TRUE(at::equal(testing::Ok((*ckpt)->Load(tensor_name, at::kFloat)), t)) << tensor_name;
  }
  const std::vector<TokenId> ids = testing::LoadGolden(name).prompts[0].ids;
  EXPECT_TRUE(at::equal(PromptLogits(dir.path(), ids), PromptLogits(testing::ModelDir(name), ids)));
}

TEST(SafetensorsTest, HalfPrecisionFilesConvertExactlyAndRun) {
  const std::string name = "tinystories-4m";
  std::map<std::string, at::Tensor> tensors = LoadAll(testing::ModelDir(name));
  for (at::ScalarType stored : {at::kBFloat16, at::kHalf}) {
    TempDir dir;
    CopyConfig(name, dir);
    SafetensorsWriter writer;
    writer.SetMetadata("format", "pt");
    for (const auto& [tensor_name, t] : tensors)
      ASSERT_TRUE(writer.Add(tensor_name, t, stored).ok());
    ASSERT_TRUE(writer.Write(dir.File("model.safetensors")).ok());
    auto file = SafetensorsFile::Open(dir.File("model.safetensors"));
    ASSERT_TRUE(file.ok());
    EXPECT_EQ((*file)->metadata().at("format"), "pt");
    for (const auto& [tensor_name, t] : tensors) {
      const TensorEntry* entry = (*file)->Find(tensor_name);
      ASSERT_NE(entry, nullptr);
      EXPECT_EQ(entry->dtype, stored == at::kBFloat16 ? StDtype::kBF16 : StDtype::kF16);
      EXPECT_TRUE(at::equal(testing::Ok((*file)->Load(tensor_name, at::kFloat)),
                            t.to(stored).to(at::kFloat)))
          << tensor_name;
    }
    testing::Golden golden = testing::LoadGolden(name);
    at::Tensor logits = PromptLogits(dir.path(), golden.prompts[2].ids);
    at::Tensor expected = golden.Tensor("p2.logits");
    double agree = (logits.argmax(-1) == expected.argmax(-1)).to(at::kDouble).mean().item<double>();
    EXPECT_GE(agree, 0.9) << c10::toString(stored);
  }
}

TEST(SafetensorsTest, TiedEmbeddingLoadsUnderEitherName) {
  // tinystories-656k ships only lm_head.weight; also write the same model with only
  // model.embed_tokens.weight and check both load to identical logits.
  const std::string name = "tinystories-656k";
  std::map<std::string, at::Tensor> tensors = LoadAll(testing::ModelDir(name));
  ASSERT_EQ(tensors.count("model.embed_tokens.weight"), 0u);
  TempDir dir;
  CopyConfig(name, dir);
  SafetensorsWriter writer;
  for (const auto& [tensor_name, t] : tensors) {
    ASSERT_TRUE(
        writer.Add(tensor_name == "lm_head.weight" ? "model.embed_tokens.weight" : tensor_name, t)
            .ok());
  }
  ASSERT_TRUE(writer.Write(dir.File("model.safetensors")).ok());
  const std::vector<TokenId> ids = testing::LoadGolden(name).prompts[1].ids;
  EXPECT_TRUE(at::equal(PromptLogits(dir.path(), ids), PromptLogits(testing::ModelDir(name), ids)));
}

TEST(SafetensorsErrorTest, TruncatedAndTinyFiles) {
  TempDir dir;
  WriteFile(dir.File("tiny.safetensors"), "abc");
  auto tiny = SafetensorsFile::Open(dir.File("tiny.safetensors"));
  EXPECT_EQ(tiny.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(tiny.status(), "shorter than the 8-byte header length")) << tiny.status();

  std::string real = ReadFile(testing::ModelDir("stories260k") + "/model.safetensors");
  WriteFile(dir.File("cut.safetensors"), real.substr(0, real.size() - 1000));
  auto cut = SafetensorsFile::Open(dir.File("cut.safetensors"));
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(cut.status(), "run past the")) << cut.status();
  EXPECT_TRUE(Contains(cut.status(), "truncated")) << cut.status();

  WriteFile(dir.File("head.safetensors"), real.substr(0, 100));
  auto head = SafetensorsFile::Open(dir.File("head.safetensors"));
  EXPECT_TRUE(Contains(head.status(), "runs past the end")) << head.status();

  auto missing = SafetensorsFile::Open(dir.File("nope.safetensors"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
}

TEST(SafetensorsErrorTest, MalformedHeaders) {
  TempDir dir;
  const std::string data(64, '\0');
  struct Case {
    std::string header, expected;
  } cases[] = {
      {"{not json", "header is not a JSON object"},
      {"[1,2]", "header is not a JSON object"},
      {R"({"a":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})",
       "unknown safetensors dtype 'F33'"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,80]}})",
       "run past the 64-byte data section"},
      {R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
       "holds 8 bytes but dtype F32 and its shape need 12"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", "are reversed"},
      {R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
       "tensors a and b overlap"},
      {R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,8]}})",
       "shape entries must be non-negative"},
      {R"({"a":{"dtype":"F32","shape":[2]}})", "data_offsets must be [begin, end]"},
      {R"({"a":{"shape":[2],"data_offsets":[0,8]}})", "missing dtype"},
      {R"({"__metadata__":{"k":1}})", "__metadata__.k is not a string"},
      {R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
       "shape overflows"},
  };
  for (const Case& c : cases) {
    WriteRaw(dir.File("bad.safetensors"), c.header, data);
    auto file = SafetensorsFile::Open(dir.File("bad.safetensors"));
    ASSERT_FALSE(file.ok()) << c.header;
    EXPECT_EQ(file.status().code(), absl::StatusCode::kDataLoss) << c.header;
    EXPECT_TRUE(Contains(file.status(), c.expected)) << c.header << " -> " << file.status();
  }
  // Header length beyond the limit is refused before allocating.
  std::string huge(8, '\0');
  uint64_t n = 1ull << 40;
  std::memcpy(huge.data(), &n, 8);
  WriteFile(dir.File("huge.safetensors"), huge + "{}");
  EXPECT_TRUE(Contains(SafetensorsFile::Open(dir.File("huge.safetensors")).status(), "exceeds"));
}

TEST(CheckpointErrorTest, MissingAndInconsistentFiles) {
  TempDir dir;
  auto none = Checkpoint::Open(dir.File("absent"));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(none.status(), "model directory does not exist"));
  auto empty = Checkpoint::Open(dir.path());
  EXPECT_TRUE(Contains(empty.status(), "neither model.safetensors nor"));

  WriteFile(dir.File("model.safetensors.index.json"), "{\"weight_map\": ");
  EXPECT_TRUE(Contains(Checkpoint::Open(dir.path()).status(), "not valid JSON"));
  WriteFile(dir.File("model.safetensors.index.json"),
            R"({"weight_map":{"w":"shard.safetensors"}})");
  auto no_shard = Checkpoint::Open(dir.path());
  EXPECT_EQ(no_shard.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(no_shard.status(), "shard.safetensors")) << no_shard.status();
  SafetensorsWriter writer;
  ASSERT_TRUE(writer.Add("other", at::zeros({2})).ok());
  ASSERT_TRUE(writer.Write(dir.File("shard.safetensors")).ok());
  auto missing_tensor = Checkpoint::Open(dir.path());
  EXPECT_TRUE(
      Contains(missing_tensor.status(), "maps 'w' to shard.safetensors, which does not contain it"))
      << missing_tensor.status();
  WriteFile(dir.File("model.safetensors.index.json"), R"({"weight_map":{"w":"../x.safetensors"}})");
  EXPECT_TRUE(Contains(Checkpoint::Open(dir.path()).status(), "must be a file name"));
}

TEST(WeightsErrorTest, MissingTensorAndWrongShapeNameTheTensor) {
  const std::string name = "stories260k";
  std::map<std::string, at::Tensor> tensors = LoadAll(testing::ModelDir(name));
  {
    TempDir dir;
    CopyConfig(name, dir);
    SafetensorsWriter writer;
    for (const auto& [n, t] : tensors) {
      if (n != "model.layers.3.mlp.up_proj.weight") {
        ASSERT_TRUE(writer.Add(n, t).ok());
      }
    }
    ASSERT_TRUE(writer.Write(dir.File("model.safetensors")).ok());
    auto model = LlamaModel::Load(dir.path(), {});
    EXPECT_EQ(model.status().code(), absl::StatusCode::kNotFound);
    EXPECT_TRUE(Contains(model.status(), "no tensor 'model.layers.3.mlp.up_proj.weight'"))
        << model.status();
  }
  {
    TempDir dir;
    CopyConfig(name, dir);
    SafetensorsWriter writer;
    for (const auto& [n, t] : tensors) {
      ASSERT_TRUE(
          writer.Add(n, n == "model.layers.1.self_attn.k_proj.weight" ? t.t().contiguous() : t)
              .ok());
    }
    ASSERT_TRUE(writer.Write(dir.File("model.safetensors")).ok());
    auto model = LlamaModel::Load(dir.path(), {});
    EXPECT_TRUE(
        Contains(model.status(),
                 "'model.layers.1.self_attn.k_proj.weight' has shape [64, 32] but config.json "
                 "implies [32, 64]"))
        << model.status();
  }
}

TEST(ConfigTest, ParsesEverySharedConfig) {
  struct Expect {
    std::string file;
    std::string type;
    int64_t params_millions;
  } expects[] = {{"tinyllama-1.1b.json", "llama", 1100}, {"mistral-7b-v0.1.json", "mistral", 7241},
                 {"qwen2.5-0.5b.json", "qwen2", 494},    {"smollm2-135m.json", "llama", 134},
                 {"qwen2.5-32b.json", "qwen2", 32763},   {"mistrallite.json", "mistral", 7241}};
  for (const Expect& e : expects) {
    auto c = ModelConfig::FromFile(testing::SharedDir() + "/configs/" + e.file);
    ASSERT_TRUE(c.ok()) << e.file << ": " << c.status();
    EXPECT_EQ(c->model_type, e.type);
    EXPECT_NEAR(c->ParameterCount() / 1e6, e.params_millions, e.params_millions * 0.01) << e.file;
  }
  auto mistral =
      testing::Ok(ModelConfig::FromFile(testing::SharedDir() + "/configs/mistral-7b-v0.1.json"));
  EXPECT_EQ(mistral.sliding_window, 4096);
  EXPECT_EQ(mistral.KvBytesPerToken(2), 2 * 32 * 8 * 128 * 2);  // 128 KiB per token in fp16
  auto lite =
      testing::Ok(ModelConfig::FromFile(testing::SharedDir() + "/configs/mistrallite.json"));
  EXPECT_EQ(lite.rope.theta, 1e6);
  auto qwen =
      testing::Ok(ModelConfig::FromFile(testing::SharedDir() + "/configs/qwen2.5-0.5b.json"));
  EXPECT_TRUE(qwen.qkv_bias);
  EXPECT_FALSE(qwen.o_bias);
  EXPECT_TRUE(qwen.tie_word_embeddings);
}

TEST(ConfigTest, RopeScalingVariants) {
  auto linear =
      ModelConfig::FromJson(R"({"model_type":"llama","hidden_size":64,"intermediate_size":128,
      "num_hidden_layers":2,"num_attention_heads":4,"vocab_size":10,"max_position_embeddings":64,
      "rope_scaling":{"type":"linear","factor":2.0}})");
  ASSERT_TRUE(linear.ok()) << linear.status();
  EXPECT_EQ(linear->rope.scaling, RopeScalingType::kLinear);
  EXPECT_EQ(linear->rope.factor, 2.0);
  auto llama3 =
      ModelConfig::FromJson(R"({"model_type":"llama","hidden_size":64,"intermediate_size":128,
      "num_hidden_layers":2,"num_attention_heads":4,"vocab_size":10,"max_position_embeddings":64,
      "rope_theta":500000.0,"rope_scaling":{"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,
      "high_freq_factor":4.0,"original_max_position_embeddings":8192}})");
  ASSERT_TRUE(llama3.ok()) << llama3.status();
  EXPECT_EQ(llama3->rope.scaling, RopeScalingType::kLlama3);
  EXPECT_EQ(llama3->rope.original_max_position_embeddings, 8192);
  EXPECT_EQ(llama3->head_dim, 16);
}

TEST(ConfigTest, BadConfigsNameTheField) {
  const std::string base = R"("hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,
      "num_attention_heads":4,"vocab_size":10,"max_position_embeddings":64)";
  struct Case {
    std::string json, expected;
  } cases[] = {
      {"{\"model_type\": \"llama\", ", "not valid JSON"},
      {"[]", "expected a JSON object"},
      {"{" + base + "}", "model_type: required field is missing"},
      {R"({"model_type":"gpt2",)" + base + "}", "model_type: 'gpt2' is not supported"},
      {R"({"model_type":"llama","hidden_act":"gelu",)" + base + "}",
       "hidden_act: 'gelu' is not supported"},
      {R"({"model_type":"llama","hidden_size":"64"})",
       "hidden_size: expected an integer, got \"64\""},
      {R"({"model_type":"llama","rope_scaling":{"type":"yarn","factor":4},)" + base + "}",
       "rope_scaling.type: 'yarn' is not supported"},
      {R"({"model_type":"llama","rope_scaling":{"rope_type":"linear"},)" + base + "}",
       "rope_scaling.factor: must be a positive number"},
      {R"({"model_type":"llama","num_key_value_heads":3,)" + base + "}",
       "num_key_value_heads: 3 does not divide num_attention_heads (4)"},
      {R"({"model_type":"qwen2","use_sliding_window":true,)" + base + "}", "use_sliding_window"},
      {R"({"model_type":"llama","hidden_size":0})", "hidden_size: must be >= 1, got 0"},
      {R"({"model_type":"llama","partial_rotary_factor":0.5,)" + base + "}",
       "partial_rotary_factor"},
  };
  for (const Case& c : cases) {
    auto config = ModelConfig::FromJson(c.json, "cfg.json");
    ASSERT_FALSE(config.ok()) << c.json;
    EXPECT_TRUE(Contains(config.status(), c.expected)) << c.json << " -> " << config.status();
    EXPECT_TRUE(Contains(config.status(), "cfg.json")) << config.status();
  }
  TempDir dir;
  EXPECT_EQ(ModelConfig::FromFile(dir.File("config.json")).status().code(),
            absl::StatusCode::kNotFound);
  auto no_config = LlamaModel::Load(dir.path(), {});
  EXPECT_TRUE(Contains(no_config.status(), "config.json")) << no_config.status();
}

}  // namespace
}  // namespace scd
