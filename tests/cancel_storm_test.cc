// A user's request must never fail because someone else cancelled theirs (issue 14: 7 of 60
// normal requests ended INVALID_ARGUMENT "chunk index 4 where 0 was due" while others were
// cancelled). Through the coordinator of the in-process serving stack, to a producer whose link is
// shaped to 0.01 Gbit/s (so sessions queue behind each other on it), over each cross-process
// backend: rounds of 4 requests cancelled by their clients at random times within 0.3 s next to 4
// normal ones; every normal one must finish with exactly the tokens of the consumer's own
// generation, and every node must end with nothing held.
#include <ATen/ATen.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/change_notice.h"
#include "model/generator.h"
#include "proto/wire_mode.h"
#include "tests/serving_stack.h"
#include "tests/test_util.h"
#include "transport/payload.h"

namespace scd {
namespace {

class CancelStormTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    producer_ = testing::Ok(LlamaModel::Load(testing::ModelDir("stories260k"), {}));
    tokenizer_ =
        testing::Ok(Tokenizer::FromFile(testing::ModelDir("stories260k") + "/tokenizer.json"));
    testing::ServingStack::Options options;
    options.backend = GetParam();
    options.producer_link.gbps = 0.01;
    stack_ = std::make_unique<testing::ServingStack>(producer_.get(), tokenizer_.get(),
                                                     "stories260k", options);
    // The producer's own weights on the consumer: raw codes rebuild its exact cache.
    stack_->AddConsumer("copy", testing::Ok(LlamaModel::Load(testing::ModelDir("stories260k"), {})),
                        std::nullopt);
    stack_->Start();
  }

  std::vector<TokenId> Prompt(int i) { return testing::LoadGolden("stories260k").prompts[i].ids; }

  std::vector<TokenId> Reference(const std::vector<TokenId>& prompt, int max_tokens) {
    KvCache cache = producer_->NewCache(64);
    GenerationOptions options;
    options.max_tokens = max_tokens;
    return testing::Ok(GenerateTokens(*producer_, prompt, &cache, options)).output_ids;
  }

  v1::GenerateRequest Request(const std::vector<TokenId>& prompt, int max_tokens) {
    v1::GenerateRequest request;
    request.add_targets("copy");
    SetRequestMode(*ParseRequestedMode("raw"), &request);
    for (TokenId id : prompt) request.add_prompt_ids(id);
    request.set_max_tokens(max_tokens);
    return request;
  }

  std::unique_ptr<LlamaModel> producer_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<testing::ServingStack> stack_;
};

// A request its client cancels after `after`; how it ended does not matter, only that it ended.
void CancelledRequest(v1::Inference::Stub* stub, const v1::GenerateRequest& request,
                      absl::Duration after) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto reader = stub->Generate(&context, request);
  std::thread canceller([&context, after] {
    // paces: the cancel comes at its drawn moment (the scenario)
    absl::SleepFor(after);
    context.TryCancel();
  });
  v1::GenerateEvent event;
  while (reader->Read(&event)) {
  }
  reader->Finish().ok();
  canceller.join();
}

TEST_P(CancelStormTest, OthersCancellingNeverBreaksARequest) {
  constexpr int kRounds = 30;
  const std::vector<TokenId> prompt = Prompt(2);
  constexpr int kTokens = 4;
  const std::vector<TokenId> expected = Reference(prompt, kTokens);
  std::mt19937 rng(14);
  std::uniform_int_distribution<int> cancel_ms(0, 300);
  int failed = 0;
  std::string first_failure;
  for (int round = 0; round < kRounds; ++round) {
    std::vector<testing::ServingReply> normal(4);
    std::vector<std::thread> threads;
    for (int i = 0; i < 4; ++i) {
      threads.emplace_back([&, i] { normal[i] = stack_->Generate(Request(prompt, kTokens)); });
      const absl::Duration after = absl::Milliseconds(cancel_ms(rng));
      threads.emplace_back(
          [&, after] { CancelledRequest(&stack_->stub(), Request(Prompt(3), 64), after); });
    }
    for (std::thread& t : threads) t.join();
    for (const testing::ServingReply& reply : normal) {
      const std::vector<v1::GenerateEvent>& events = reply.events.at("copy");
      const bool ok = reply.status.ok() && !events.empty() && events.back().has_finished() &&
                      reply.ids.at("copy") == expected;
      if (!ok) {
        ++failed;
        if (first_failure.empty()) {
          first_failure = absl::StrCat("round ", round, ": ", reply.status.error_message(), " ",
                                       events.empty() ? "no events" : events.back().DebugString());
        }
      }
    }
  }
  EXPECT_EQ(failed, 0) << "of " << 4 * kRounds << " normal requests; first: " << first_failure;
  // Nothing held anywhere once the storm is over: sessions end, buffers go back.
  AwaitChange(
      [&] {
        return stack_->producer_service().open_sessions() == 0 &&
               stack_->consumer("copy").admission->active() == 0;
      },
      absl::Now() + absl::Seconds(5));
  EXPECT_EQ(stack_->producer_service().open_sessions(), 0u);
  EXPECT_EQ(stack_->consumer("copy").admission->active(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Backends, CancelStormTest, ::testing::Values("grpc", "ucx", "inproc"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace scd
