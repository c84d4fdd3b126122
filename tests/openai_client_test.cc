// The OpenAI-compatible API (coordinator/openai_api.h) through the official `openai` npm client
// (tests/openai_client_check.mjs: models, completions and chat, whole and streamed, logprobs,
// errors), against `scd serve --all-in-one --http-listen`; the completion's text equals what the
// project's gRPC client gets for the same greedy request. The npm package is installed into the
// build tree by a ctest fixture (openai_npm_install).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "tests/test_daemon.h"
#include "tests/test_files.h"

namespace scd {
namespace {

using testing::Bin;
using testing::Daemon;

TEST(OpenAiClientTest, TheOfficialClientStreamsChatAndCompletions) {
  testing::TempDir dir;
  const std::string base = testing::ModelDir("stories260k");
  Daemon server(dir.path(), "serve",
                {Bin("scd"), "serve", "--all-in-one", "--producer-model", base, "--consumer",
                 "copy=" + base, "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"});
  const std::string http = server.HttpAddress();
  const std::string grpc = server.Address(absl::Seconds(60));
  ASSERT_FALSE(grpc.empty());
  const std::string prompt = "Once upon a time, there was a little dog";
  const testing::CommandResult node = testing::RunCommand(
      "node " + std::string(SCD_SOURCE_DIR) + "/tests/openai_client_check.mjs " +
      testing::BuildDir() + "/node-openai/node_modules " + http + " copy '" + prompt + "'");
  ASSERT_EQ(node.exit_code, 0) << node.err << node.out;
  const nlohmann::json result = nlohmann::json::parse(node.out);
  const std::string completion = result["completion"].get<std::string>();
  ASSERT_FALSE(completion.empty());

  // The project's gRPC client, the same greedy request (auto mode is raw for identical weights).
  const testing::CommandResult cpp = testing::RunCommand(
      Bin("scd") + " generate --server " + grpc + " --target copy --max-tokens 12 --prompt '" +
      prompt + "'");
  ASSERT_EQ(cpp.exit_code, 0) << cpp.err;
  EXPECT_THAT(cpp.out, ::testing::HasSubstr(completion));
}

}  // namespace
}  // namespace scd
