// A transfer that loses its producer mid-way is taken over by another producer of the model
// (issue 50): the first producer's link to the consumer closes at the chunks of layer `kCut` (a
// fault on its links, the producer itself alive: it fails that target as UNAVAILABLE), the
// consumer says so on its control stream (GenerateEvent.transfer_lost, never forwarded) with the
// layers it rebuilt, and the coordinator asks the second producer for the rest
// (PrefillTarget.layer_begin). The client's stream is the unfaulted one's token for token
// (greedy; the same producer weights, so the same cache), one Started, no Error, Finished in the
// mode asked (not a fallback) counting one takeover -- also for a request that forbids the
// fallback, which would otherwise have ended in an Error. With no other producer live the
// consumer is told at once and falls back to its own prefill, the reason naming why.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "proto/wire_mode.h"
#include "tests/serving_stack.h"
#include "tests/test_util.h"
#include "tokenizer/tokenizer.h"

namespace scd {
namespace {

using ::testing::HasSubstr;

constexpr char kTarget[] = "tinystories-4m-b";
// tinystories-4m has 6 layers, 2 raw chunks each (keys, values): the link closes at the first
// chunk of layer 4, after layers 0-3 went out.
constexpr int kCut = 4;

class TakeoverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    producer_ = testing::Ok(LlamaModel::Load(testing::ModelDir("tinystories-4m"), {}));
    tokenizer_ =
        testing::Ok(Tokenizer::FromFile(testing::ModelDir("tinystories-4m") + "/tokenizer.json"));
  }

  std::unique_ptr<testing::ServingStack> Stack(bool faulty, bool second_producer) {
    testing::ServingStack::Options options;
    options.second_producer = second_producer;
    if (faulty) {
      transport::FaultRule cut;
      cut.action = transport::FaultAction::kDisconnect;
      cut.type = transport::FrameType::kChunk;
      cut.nth = 2 * kCut;
      options.producer_faults.rules.push_back(cut);
    }
    auto stack = std::make_unique<testing::ServingStack>(producer_.get(), tokenizer_.get(),
                                                         "tinystories-4m", options);
    stack->AddConsumer(kTarget,
                       testing::Ok(LlamaModel::Load(testing::ModelDir("tinystories-4m-b"), {})),
                       std::nullopt);
    stack->Start();
    return stack;
  }

  // Raw codes (the producer's own cache, across weights), greedy.
  static v1::GenerateRequest Request() {
    v1::GenerateRequest request;
    request.add_targets(kTarget);
    SetRequestMode(RequestedMode(TransferMode::kRaw), &request);
    const std::vector<TokenId> prompt = testing::LoadGolden("tinystories-4m-b").prompts[1].ids;
    for (TokenId id : prompt) request.add_prompt_ids(id);
    request.set_max_tokens(24);
    return request;
  }

  static const v1::Finished& FinishedOf(const testing::ServingReply& reply) {
    const std::vector<v1::GenerateEvent>& events = reply.events.at(kTarget);
    EXPECT_TRUE(events.back().has_finished()) << events.back().DebugString();
    return events.back().finished();
  }

  std::unique_ptr<LlamaModel> producer_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_F(TakeoverTest, ASecondProducerSendsTheRestAndTheStreamIsTheUnfaultedOne) {
  const testing::ServingReply unfaulted = Stack(false, false)->Generate(Request());
  ASSERT_TRUE(unfaulted.status.ok()) << unfaulted.status.error_message();
  ASSERT_EQ(FinishedOf(unfaulted).takeovers(), 0u);
  for (bool fallback_allowed : {true, false}) {
    SCOPED_TRACE(fallback_allowed ? "fallback allowed" : "fallback forbidden");
    v1::GenerateRequest request = Request();
    request.set_allow_local_fallback(fallback_allowed);
    std::unique_ptr<testing::ServingStack> stack = Stack(true, true);
    const testing::ServingReply reply = stack->Generate(request);
    ASSERT_TRUE(reply.status.ok()) << reply.status.error_message();
    const std::vector<v1::GenerateEvent>& events = reply.events.at(kTarget);
    int started = 0;
    for (const v1::GenerateEvent& event : events) {
      started += event.has_started();
      EXPECT_FALSE(event.has_transfer_lost()) << "the control plane's notice reached the client";
      EXPECT_FALSE(event.has_error()) << event.DebugString();
    }
    EXPECT_EQ(started, 1);
    const v1::Finished& finished = FinishedOf(reply);
    EXPECT_EQ(finished.takeovers(), 1u) << finished.mode_reason();
    EXPECT_EQ(finished.transfer_mode(), v1::TRANSFER_MODE_RAW) << finished.mode_reason();
    EXPECT_THAT(finished.mode_reason(), HasSubstr("another took the transfer over"));
    EXPECT_GE(finished.payload_bytes(), events.front().started().expected_payload_bytes());
    EXPECT_EQ(reply.ids.at(kTarget), unfaulted.ids.at(kTarget));
    EXPECT_EQ(stack->second_producer_service().prefills(), 1u) << "the takeover ran there";
  }
}

TEST_F(TakeoverTest, WithNoOtherProducerTheConsumerIsToldAtOnceAndFallsBack) {
  std::unique_ptr<testing::ServingStack> stack = Stack(true, false);
  const testing::ServingReply reply = stack->Generate(Request());
  ASSERT_TRUE(reply.status.ok()) << reply.status.error_message();
  const v1::Finished& finished = FinishedOf(reply);
  EXPECT_EQ(finished.takeovers(), 0u);
  EXPECT_EQ(finished.transfer_mode(), v1::TRANSFER_MODE_LOCAL) << finished.mode_reason();
  EXPECT_THAT(finished.mode_reason(), HasSubstr("no takeover: no other live producer"));
  EXPECT_THAT(finished.mode_reason(), HasSubstr("peer lost")) << "why the transfer failed first";
  EXPECT_THAT(finished.mode_reason(), HasSubstr("no producer took it over"));
}

}  // namespace
}  // namespace scd
