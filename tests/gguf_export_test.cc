// ExportGguf (model/gguf_export.h) read back by llama.cpp's side: node-llama-cpp's own GGUF parser
// (bench/peer/gguf_info.mjs) reads an exported checkpoint's metadata, vocabulary and tensor
// descriptions, which must say what the checkpoint is; a Q8_0 file keeps the matrices whose rows
// are not a multiple of 32 in F32 and says so; Q and K rows are interleaved per head as llama.cpp's
// rope expects (checked against the permutation's definition). The placeholder vocabulary of dummy
// weights is checked without the peer. Whether llama.cpp computes the same tokens from the file is
// tests/peer_greedy_test.cc.
#include "model/gguf_export.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "model/gguf_vocab.h"
#include "tests/test_util.h"

namespace scd {
namespace {

using json = nlohmann::json;

std::string PeerDir() { return std::string(SCD_SOURCE_DIR) + "/bench/peer"; }

void RequirePeer() {
  if (std::filesystem::exists(PeerDir() + "/node_modules/node-llama-cpp/package.json")) return;
  const char* ci = std::getenv("CI");
  if (ci != nullptr && std::string(ci) == "true") {
    FAIL() << "node-llama-cpp (bench/peer/node_modules) is not installed: scripts/setup.sh does";
  }
  GTEST_SKIP() << "node-llama-cpp not installed (bash scripts/setup.sh installs bench/peer)";
}

json ReadBack(const std::string& file) {
  const testing::CommandResult r =
      testing::RunCommand("node " + PeerDir() + "/gguf_info.mjs " + file);
  if (r.exit_code != 0) throw std::runtime_error("gguf_info.mjs: " + r.err);
  return json::parse(r.out);
}

TEST(GgufExportTest, LlamaCppsParserReadsTheCheckpointBack) {
  RequirePeer();
  if (::testing::Test::IsSkipped() || ::testing::Test::HasFailure()) return;
  const std::string dir = testing::ModelDir("stories260k");
  const auto model = testing::Ok(LlamaModel::Load(dir, {}));
  testing::TempDir tmp;
  GgufExportOptions options;
  options.type = GgmlType::kQ8_0;
  options.name = "stories260k";
  options.tokenizer_json = dir + "/tokenizer.json";
  const GgufExportReport report = testing::Ok(ExportGguf(*model, options, tmp.File("m.gguf")));
  EXPECT_EQ(report.tensors, 2 + 9 * 5);  // token_embd, output_norm (tied: no output), 9 a layer
  EXPECT_EQ(report.kept_f32.size(), 5u) << "ffn_down's rows are 172 long in every layer";
  const json info = ReadBack(tmp.File("m.gguf"));
  const json& m = info["metadata"];
  EXPECT_EQ(m["general"]["architecture"], "llama");
  EXPECT_EQ(m["general"]["file_type"], 7);  // MOSTLY_Q8_0
  EXPECT_EQ(m["llama"]["block_count"], 5);
  EXPECT_EQ(m["llama"]["embedding_length"], 64);
  EXPECT_EQ(m["llama"]["feed_forward_length"], 172);
  EXPECT_EQ(m["llama"]["attention"]["head_count"], 8);
  EXPECT_EQ(m["llama"]["attention"]["head_count_kv"], 4);
  EXPECT_EQ(m["llama"]["rope"]["dimension_count"], 8);
  EXPECT_FLOAT_EQ(m["llama"]["rope"]["freq_base"].get<float>(), 10000.0f);
  EXPECT_FLOAT_EQ(m["llama"]["attention"]["layer_norm_rms_epsilon"].get<float>(), 1e-5f);
  const json& tok = m["tokenizer"]["ggml"];
  EXPECT_EQ(tok["model"], "llama");
  ASSERT_EQ(tok["tokens"].size(), 512u);
  EXPECT_EQ(tok["tokens"][1], "<s>");
  EXPECT_EQ(tok["tokens"][13], "<0x0A>");
  EXPECT_EQ(tok["token_type"][13], 6);  // byte
  EXPECT_EQ(tok["token_type"][1], 3);   // control
  EXPECT_EQ(tok["token_type"][0], 2);   // unknown
  EXPECT_EQ(tok["bos_token_id"], 1);
  EXPECT_EQ(tok["eos_token_id"], 2);
  EXPECT_EQ(tok["add_bos_token"], true);
  // The first merge ("▁ t") makes the highest-scoring merged piece.
  const auto tokens = tok["tokens"].get<std::vector<std::string>>();
  const size_t t = std::find(tokens.begin(), tokens.end(), "\xe2\x96\x81t") - tokens.begin();
  ASSERT_LT(t, tokens.size());
  float best_merged = -1e30f;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tok["token_type"][i] == 1 && tokens[i].size() > 3 && i != t) {
      best_merged = std::max(best_merged, tok["scores"][i].get<float>());
    }
  }
  EXPECT_GT(tok["scores"][t].get<float>(), best_merged);
  std::map<std::string, json> tensors;
  for (const json& x : info["tensors"]) tensors[x["name"]] = x;
  ASSERT_EQ(tensors.size(), 47u);
  EXPECT_EQ(tensors["token_embd.weight"]["dims"], json({64, 512}));
  EXPECT_EQ(tensors["token_embd.weight"]["type"], 8);
  EXPECT_EQ(tensors["blk.0.attn_q.weight"]["type"], 8);
  EXPECT_EQ(tensors["blk.0.attn_k.weight"]["dims"], json({64, 32}));
  EXPECT_EQ(tensors["blk.4.ffn_down.weight"]["type"], 0);  // F32: rows of 172
  EXPECT_EQ(tensors["blk.4.ffn_down.weight"]["dims"], json({172, 64}));
  EXPECT_EQ(tensors["output_norm.weight"]["type"], 0);
  EXPECT_EQ(tensors.count("output.weight"), 0u);
}

TEST(GgufExportTest, QAndKRowsAreInterleavedPerHeadAsLlamaCppsRopeTurnsThem) {
  // F32 export of a tiny dummy model, the q rows read straight from the file: row 2 i + s of head
  // h in the file is row s * hd/2 + i of that head in the checkpoint (convert_hf_to_gguf permute).
  ModelConfig c = testing::Ok(ModelConfig::FromFile(testing::ModelDir("stories260k") + "/config.json"));
  c.num_layers = 1;
  const auto model = LlamaModel::Dummy(c, 3, {});
  testing::TempDir tmp;
  GgufExportOptions options;
  options.name = "tiny";
  const GgufExportReport report = testing::Ok(ExportGguf(*model, options, tmp.File("t.gguf")));
  EXPECT_EQ(report.vocabulary.rfind("placeholder", 0), 0u);
  const std::string file = testing::ReadFile(tmp.File("t.gguf"));
  // Find the attn_q data: the file's q matrix is the only [64, 64] float block equal to some
  // permutation of the checkpoint's; locate it by its first row.
  const at::Tensor wq = model->weights().layers[0].Wq(c).contiguous();
  const int64_t hd = c.head_dim, H = c.num_heads;
  at::Tensor expected = at::empty_like(wq);
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t i = 0; i < hd / 2; ++i) {
      for (int64_t s = 0; s < 2; ++s) expected[h * hd + 2 * i + s] = wq[h * hd + s * hd / 2 + i];
    }
  }
  const std::string first(reinterpret_cast<const char*>(expected.data_ptr<float>()),
                          expected.numel() * sizeof(float));
  EXPECT_NE(file.find(first), std::string::npos) << "the interleaved W_q is not in the file";
  const std::string plain(reinterpret_cast<const char*>(wq.data_ptr<float>()),
                          wq.numel() * sizeof(float));
  EXPECT_EQ(file.find(plain), std::string::npos) << "W_q was written in rotate-half order";
}

TEST(GgufExportTest, PlaceholderVocabularyOfDummyWeights) {
  const ModelConfig c = testing::Ok(
      ModelConfig::FromFile(testing::SharedDir() + "/configs/tinyllama-1.1b.json"));
  const GgufVocabulary v = PlaceholderVocabulary(c);
  ASSERT_EQ(v.tokens.size(), 32000u);
  EXPECT_EQ(v.tokens[0], "<unk>");
  EXPECT_EQ(v.types[0], 2);
  EXPECT_EQ(v.tokens[1], "<s>");
  EXPECT_EQ(v.types[1], 3);
  EXPECT_EQ(v.tokens[2], "</s>");
  EXPECT_EQ(v.tokens[3], "<0x00>");
  EXPECT_EQ(v.types[258], 6);
  EXPECT_EQ(v.tokens[258], "<0xFF>");
  EXPECT_EQ(v.types[259], 1);
  EXPECT_EQ(*v.bos, 1);
  EXPECT_EQ(*v.eos, 2);
}

TEST(GgufExportTest, RefusesPackedWeights) {
  LlamaModel::Options options;
  options.weights = WeightFormat::kInt8;
  const auto model = testing::Ok(LlamaModel::Load(testing::ModelDir("stories260k"), options));
  testing::TempDir tmp;
  const absl::StatusOr<GgufExportReport> r = ExportGguf(*model, {}, tmp.File("x.gguf"));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
}

}  // namespace
}  // namespace scd
