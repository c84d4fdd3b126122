// A slow client slows only its own stream (issue 30), through the in-process serving stack's
// coordinator (its callback Generate, coordinator/routed_request.h) to two consumers of
// stories260k's own weights: a fan-out of 400 tokens to both, with 20 log-probabilities per
// token, read one event every 2 ms after a pause of half a second by a client that takes 4 KiB
// ahead of its reads (so gRPC's flow-control window fills, then the coordinator's queue of events
// behind it: its targets stop reading until the client drains it), and beside it requests read
// at full speed.
// The fast ones end while the slow one is still being read; the slow one gets every event, in
// order, with the tokens of the same request served alone -- where a batched run parts from it,
// only at a near-tie of the alone run (batching_test.cc derives the bound).
#include <ATen/ATen.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "proto/wire_mode.h"
#include "tests/serving_stack.h"
#include "tests/test_util.h"

namespace scd {
namespace {

TEST(SlowClientTest, ASlowReaderSlowsOnlyItsOwnStream) {
  auto producer = testing::Ok(LlamaModel::Load(testing::ModelDir("stories260k"), {}));
  testing::ServingStack::Options options;
  options.deadline = absl::Seconds(120);
  testing::ServingStack stack(producer.get(), nullptr, "stories260k", options);
  for (const char* name : {"a", "b"}) {
    stack.AddConsumer(name, testing::Ok(LlamaModel::Load(testing::ModelDir("stories260k"), {})),
                      std::nullopt);
  }
  stack.Start();
  const std::vector<TokenId> prompt = testing::LoadGolden("stories260k").prompts[0].ids;
  v1::GenerateRequest slow_request;
  slow_request.add_targets("a");
  slow_request.add_targets("b");
  SetRequestMode(*ParseRequestedMode("local"), &slow_request);
  for (TokenId id : prompt) slow_request.add_prompt_ids(id);
  slow_request.set_max_tokens(400);
  slow_request.set_logprobs(20);
  const testing::ServingReply alone = stack.Generate(slow_request);
  ASSERT_TRUE(alone.status.ok()) << alone.status.error_message();
  ASSERT_EQ(alone.ids.at("a").size(), 400u);

  std::atomic<bool> slow_done{false};
  std::map<std::string, std::vector<TokenId>> slow_ids;
  std::map<std::string, int> terminals;
  grpc::Status slow_status;
  absl::Notification reading;  // the slow stream's first event came
  std::thread slow([&] {
    // A client that takes little ahead of its reads: 4 KiB a stream, no window growth.
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 4096);
    auto stub = v1::Inference::NewStub(grpc::CreateCustomChannel(
        stack.coordinator_address(), grpc::InsecureChannelCredentials(), args));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
    auto reader = stub->Generate(&context, slow_request);
    v1::GenerateEvent event;
    bool first = true;
    while (reader->Read(&event)) {
      if (first) {
        reading.Notify();
        // paces: the windows and the queue fill (a slow reader is the scenario)
        absl::SleepFor(absl::Milliseconds(500));
      }
      first = false;
      for (int32_t id : event.token().ids()) slow_ids[event.target()].push_back(id);
      if (event.has_finished() || event.has_error()) ++terminals[event.target()];
      // paces: a slow reader (the scenario)
      absl::SleepFor(absl::Milliseconds(2));
    }
    slow_status = reader->Finish();
    slow_done = true;
  });
  // Beside it, once it streams, requests read at full speed end long before it.
  ASSERT_TRUE(reading.WaitForNotificationWithTimeout(absl::Seconds(60)));
  for (int i = 0; i < 3; ++i) {
    const testing::ServingReply fast = stack.Generate({"b"}, "local", prompt, 64);
    ASSERT_TRUE(fast.status.ok()) << fast.status.error_message();
    EXPECT_EQ(fast.ids.at("b").size(), 64u);
  }
  EXPECT_FALSE(slow_done.load()) << "the slow stream ended before the fast ones: not slow enough "
                                    "to show anything";
  slow.join();
  ASSERT_TRUE(slow_status.ok()) << slow_status.error_message();
  const ModelConfig& c = producer->config();
  const double tie = 50 * testing::kFloat32Epsilon *
                     static_cast<double>(std::max(c.hidden_size, c.intermediate_size)) *
                     static_cast<double>(c.num_layers);
  for (const char* target : {"a", "b"}) {
    EXPECT_EQ(terminals[target], 1) << target;
    const std::vector<TokenId>& want = alone.ids.at(target);
    ASSERT_EQ(slow_ids[target].size(), want.size()) << target;
    std::vector<double> gaps;  // the alone run's top-1 minus top-2 log-probability per token
    for (const v1::GenerateEvent& e : alone.events.at(target)) {
      for (const v1::TokenLogprobs& lp : e.token().logprobs()) {
        gaps.push_back(lp.top(0).logprob() - lp.top(1).logprob());
      }
    }
    ASSERT_EQ(gaps.size(), want.size());
    for (size_t k = 0; k < want.size(); ++k) {
      if (slow_ids[target][k] == want[k]) continue;
      EXPECT_LE(gaps[k], tie) << target << " token " << k;  // parted only at a near-tie
      break;
    }
  }
}

}  // namespace
}  // namespace scd
