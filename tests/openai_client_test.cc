// The OpenAI-compatible API (coordinator/openai_api.h) through the official `openai` npm client
// (tests/openai_client_check.mjs: models, completions and chat, whole and streamed, logprobs,
// a fan-out through the `targets` extension, errors), against `scd serve --all-in-one --http-listen`; the completion's text equals what the
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
                 "copy=" + base, "--consumer", "copy2=" + base, "--listen", "127.0.0.1:0",
                 "--http-listen", "127.0.0.1:0"});
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

// A model whose tokenizer_config.json has a chat template: chat prompts are that template's
// rendering (the same greedy text as a completion of the rendered prompt), and a template's
// raise_exception is a 400 with its message.
TEST(OpenAiClientTest, ChatUsesTheModelsChatTemplate) {
  testing::TempDir dir;
  const std::string model = dir.File("model");
  const std::string base = testing::ModelDir("stories260k");
  const testing::CommandResult linked = testing::RunCommand(
      "mkdir -p " + model + " && ln -s " + base + "/config.json " + base +
      "/model.safetensors " + base + "/tokenizer.json " + model + "/");
  ASSERT_EQ(linked.exit_code, 0) << linked.err;
  testing::WriteFile(
      model + "/tokenizer_config.json",
      nlohmann::json{{"chat_template",
                      "{% if messages[0]['role'] == 'assistant' %}{{ raise_exception('user "
                      "first') }}{% endif %}{% for m in messages %}{{ m.role | upper }}> {{ "
                      "m.content }}\n{% endfor %}{% if add_generation_prompt %}ASSISTANT>{% endif "
                      "%}"}}
          .dump());
  Daemon server(dir.path(), "serve",
                {Bin("scd"), "serve", "--all-in-one", "--producer-model", model, "--consumer",
                 "copy=" + base, "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"});
  const std::string http = server.HttpAddress();
  ASSERT_FALSE(server.Address(absl::Seconds(60)).empty());
  auto post = [&](const std::string& path, const nlohmann::json& body) {
    testing::WriteFile(dir.File("body.json"), body.dump());
    const testing::CommandResult r = testing::RunCommand(
        "curl -s -m 60 -w '\n%{http_code}' http://" + http + path + " -d @" + dir.File("body.json"));
    const size_t cut = r.out.rfind('\n');
    return std::make_pair(r.out.substr(cut + 1), nlohmann::json::parse(r.out.substr(0, cut), nullptr, false));
  };
  const auto [chat_status, chat] = post(
      "/v1/chat/completions",
      {{"model", "copy"}, {"max_tokens", 10}, {"temperature", 0},
       {"messages", {{{"role", "user"}, {"content", "Once upon a time"}}}}});
  ASSERT_EQ(chat_status, "200") << chat.dump();
  const auto [completion_status, completion] =
      post("/v1/completions", {{"model", "copy"}, {"max_tokens", 10}, {"temperature", 0},
                               {"prompt", "USER> Once upon a time\nASSISTANT>"}});
  ASSERT_EQ(completion_status, "200") << completion.dump();
  EXPECT_EQ(chat["choices"][0]["message"]["content"], completion["choices"][0]["text"]);
  EXPECT_EQ(chat["usage"]["prompt_tokens"], completion["usage"]["prompt_tokens"]);

  const auto [refused_status, refused] = post(
      "/v1/chat/completions",
      {{"model", "copy"}, {"messages", {{{"role", "assistant"}, {"content", "hi"}}}}});
  EXPECT_EQ(refused_status, "400");
  EXPECT_THAT(refused["error"]["message"].get<std::string>(),
              ::testing::HasSubstr("the model's chat template: user first"));

  // Auto's objectives in the body: refused before any work with the field named when out of
  // range or with a mode that does not choose; served otherwise.
  for (const auto& [extra, field] :
       std::vector<std::pair<nlohmann::json, std::string>>{
           {{{"ttft_slo_ms", 3600001}}, "ttft_slo_ms"},
           {{{"ttft_slo_ms", -5}}, "ttft_slo_ms"},
           {{{"ttft_slo_ms", 100}, {"mode", "raw"}}, "ttft_slo_ms"},
           {{{"max_kl", 11}}, "max_kl"}}) {
    nlohmann::json body = {{"model", "copy"}, {"max_tokens", 2}, {"prompt", "Once"}};
    body.update(extra);
    const auto [status, reply] = post("/v1/completions", body);
    EXPECT_EQ(status, "400") << extra.dump();
    EXPECT_THAT(reply["error"]["message"].get<std::string>(), ::testing::HasSubstr(field));
  }
  const auto [slo_status, slo] = post("/v1/completions", {{"model", "copy"},
                                                          {"max_tokens", 2},
                                                          {"prompt", "Once"},
                                                          {"ttft_slo_ms", 60000}});
  EXPECT_EQ(slo_status, "200") << slo.dump();
}

}  // namespace
}  // namespace scd
