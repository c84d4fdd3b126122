// The `scd` binary end to end: real generation from ../shared/models, and every kind of bad
// input ending in one clear error line and exit status 1 (never a crash or a signal).
#include <gtest/gtest.h>

#include <filesystem>

#include "model/safetensors.h"
#include "tests/test_util.h"
#include "tokenizer/tokenizer.h"

namespace scd {
namespace {

namespace fs = std::filesystem;
using testing::CommandResult;
using testing::RunCommand;
using testing::TempDir;
using testing::WriteFile;

std::string Scd() { return testing::BuildDir() + "/bin/scd"; }

// Copies a shared model directory so a test can damage one file of it.
void CopyModel(const std::string& name, const TempDir& to) {
  for (const auto& entry : fs::directory_iterator(testing::ModelDir(name))) {
    fs::copy_file(entry.path(), fs::path(to.path()) / entry.path().filename());
  }
}

// `scd generate` on a model directory with a short prompt.
CommandResult GenerateOn(const std::string& model_dir) {
  return RunCommand(Scd() + " generate --model " + model_dir + " --prompt hi");
}

void ExpectCleanError(const CommandResult& r, const std::string& message) {
  EXPECT_EQ(r.signal, 0) << "crashed: " << r.err;
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("scd: error: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(message), std::string::npos) << "stderr: " << r.err;
}

TEST(CliTest, GenerateStreamsGoldenGreedyText) {
  // The streamed text is the prompt followed by the golden greedy continuation.
  const std::string model = testing::ModelDir("stories260k");
  testing::Golden golden = testing::LoadGolden("stories260k");
  const testing::GoldenPrompt& prompt = golden.prompts[0];
  CommandResult r = RunCommand(Scd() + " generate --model " + model + " --prompt '" + prompt.text +
                               "' --max-tokens 40 --ignore-eos");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto tokenizer = Tokenizer::FromFile(model + "/tokenizer.json");
  ASSERT_TRUE(tokenizer.ok());
  std::vector<TokenId> all = prompt.ids;
  all.insert(all.end(), prompt.greedy_40.begin(), prompt.greedy_40.end());
  EXPECT_EQ(r.out, (*tokenizer)->Decode(all, /*skip_special_tokens=*/true) + "\n");
  EXPECT_EQ(r.out.rfind(prompt.text + " ", 0), 0u) << r.out;
}

TEST(CliTest, PromptIdsStreamTheSameTextAsThePrompt) {
  const std::string model = testing::ModelDir("stories260k");
  const testing::GoldenPrompt prompt = testing::LoadGolden("stories260k").prompts[0];
  std::string ids;
  for (TokenId id : prompt.ids) ids += (ids.empty() ? "" : ",") + std::to_string(id);
  const std::string flags = " --max-tokens 20 --ignore-eos";
  CommandResult from_text =
      RunCommand(Scd() + " generate --model " + model + " --prompt '" + prompt.text + "'" + flags);
  CommandResult from_ids =
      RunCommand(Scd() + " generate --model " + model + " --prompt-ids " + ids + flags);
  ASSERT_EQ(from_text.exit_code, 0) << from_text.err;
  ASSERT_EQ(from_ids.exit_code, 0) << from_ids.err;
  EXPECT_EQ(from_ids.out, from_text.out);
}

TEST(CliTest, InfoAndTokenize) {
  CommandResult info = RunCommand(Scd() + " info --model " + testing::ModelDir("tinystories-4m"));
  ASSERT_EQ(info.exit_code, 0) << info.err;
  EXPECT_NE(info.out.find("KV bytes per token  6144 (f32)"), std::string::npos) << info.out;
  CommandResult cfg =
      RunCommand(Scd() + " info --model " + testing::SharedDir() + "/configs/mistral-7b-v0.1.json");
  ASSERT_EQ(cfg.exit_code, 0) << cfg.err;
  EXPECT_NE(cfg.out.find("sliding_window      4096"), std::string::npos) << cfg.out;
  CommandResult tok = RunCommand(Scd() + " tokenize --model " + testing::ModelDir("stories260k") +
                                 " 'Once upon a time, there was a little girl named Lily.'");
  ASSERT_EQ(tok.exit_code, 0) << tok.err;
  EXPECT_EQ(tok.out, "1 403 407 261 378 432 383 286 261 376 298 315 421 395 317 426\n");
}

TEST(CliTest, DummyWeightsFromConfigAlone) {
  CommandResult r = RunCommand(Scd() + " generate --model " + testing::SharedDir() +
                               "/configs/smollm2-135m.json --dummy-weights --layers 2"
                               " --prompt-ids 1,2,3 --max-tokens 4 --ignore-eos");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(r.out.empty());
}

TEST(CliErrorTest, MissingModelDirectory) {
  ExpectCleanError(GenerateOn("/nonexistent/model"),
                   "/nonexistent/model/config.json: cannot open config file");
}

TEST(CliErrorTest, TruncatedSafetensors) {
  TempDir dir;
  CopyModel("stories260k", dir);
  fs::resize_file(dir.File("model.safetensors"), fs::file_size(dir.File("model.safetensors")) / 2);
  ExpectCleanError(GenerateOn(dir.path()), "invalid safetensors file");
}

TEST(CliErrorTest, BadSafetensorsOffsets) {
  TempDir dir;
  CopyModel("stories260k", dir);
  // Shift one tensor's offsets past the end of the data section.
  std::string bytes = testing::ReadFile(dir.File("model.safetensors"));
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  std::string header = bytes.substr(8, n);
  const std::string key = "\"data_offsets\":[";
  size_t at = header.find(key);
  ASSERT_NE(at, std::string::npos);
  header.replace(at + key.size(), 1, "9");  // first offset 0 -> 9..., far past the data
  bytes.replace(8, n, header);
  WriteFile(dir.File("model.safetensors"), bytes);
  ExpectCleanError(GenerateOn(dir.path()), "invalid safetensors file");
}

TEST(CliErrorTest, MalformedConfigJson) {
  TempDir dir;
  CopyModel("stories260k", dir);
  WriteFile(dir.File("config.json"), "{\"model_type\": \"llama\", \"hidden_size\": 64,");
  ExpectCleanError(GenerateOn(dir.path()), "config.json: not valid JSON");
}

TEST(CliErrorTest, UnknownArchitecture) {
  TempDir dir;
  CopyModel("stories260k", dir);
  std::string config = testing::ReadFile(dir.File("config.json"));
  config.replace(config.find("\"llama\""), 7, "\"falcon\"");
  WriteFile(dir.File("config.json"), config);
  ExpectCleanError(RunCommand(Scd() + " info --model " + dir.path()),
                   "model_type: 'falcon' is not supported");
}

TEST(CliErrorTest, MalformedTokenizerJson) {
  TempDir dir;
  CopyModel("stories260k", dir);
  WriteFile(dir.File("tokenizer.json"), "{\"model\": {\"type\": \"BPE\"");
  ExpectCleanError(GenerateOn(dir.path()), "tokenizer.json");
}

TEST(CliErrorTest, PromptLongerThanMaxPositions) {
  // llama2xs-260k has 256 positions; 300 words tokenize to more.
  std::string prompt;
  for (int i = 0; i < 300; ++i) prompt += "cat ";
  ExpectCleanError(RunCommand(Scd() + " generate --model " + testing::ModelDir("llama2xs-260k") +
                              " --prompt '" + prompt + "'"),
                   "exceeds max_position_embeddings (256)");
}

TEST(CliErrorTest, BadFlagValues) {
  const std::string model = testing::ModelDir("stories260k");
  ExpectCleanError(RunCommand(Scd() + " generate --model " + model + " --prompt hi --top-p 2"),
                   "top_p must be in (0, 1]");
  ExpectCleanError(RunCommand(Scd() + " generate --model " + model + " --prompt-ids 1,x"),
                   "'x' is not an integer");
  ExpectCleanError(RunCommand(Scd() + " generate --model " + model + " --prompt-ids 1,999"),
                   "outside the vocabulary");
  ExpectCleanError(RunCommand(Scd() + " generate --model " + model + " --prompt hi --device tpu"),
                   "device 'tpu' is not supported");
  ExpectCleanError(RunCommand(Scd() + " generate --model " + model + " --prompt hi --dtype fp8"),
                   "expected f32, bf16, f16 or int8");
  // Weights below float32 run on the CPU (model/packed_weight.h): greedy tokens as text.
  for (const char* dtype : {"f16", "bf16", "int8"}) {
    const CommandResult r = RunCommand(Scd() + " generate --model " + model +
                                       " --prompt 'Once upon a time' --max-tokens 8 --dtype " + dtype);
    EXPECT_EQ(r.exit_code, 0) << dtype << ": " << r.err;
    EXPECT_FALSE(r.out.empty()) << dtype;
  }
  CommandResult usage = RunCommand(Scd() + " generate --prompt hi");
  EXPECT_NE(usage.exit_code, 0);
  EXPECT_EQ(usage.signal, 0);
  EXPECT_NE(usage.err.find("give --model DIR or --server"), std::string::npos) << usage.err;
  // Client mode against nothing listening: one clean error line, no hang.
  ExpectCleanError(RunCommand(Scd() + " generate --server 127.0.0.1:1 --target x --prompt hi"),
                   "127.0.0.1:1");
  // serve without --all-in-one says where separate nodes are.
  ExpectCleanError(
      RunCommand(Scd() + " serve --producer-model " + model + " --consumer a=" + model),
      "scd-coordinator");
}

}  // namespace
}  // namespace scd
