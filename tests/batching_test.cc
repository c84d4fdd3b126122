// Continuous batching through the whole serving path (coordinator, producer, consumer as gRPC
// servers, codes over the gRPC transport): the greedy tokens of every request served in a batch --
// requests arriving one after another while others decode, each leaving at its own max_tokens --
// equal those of the same request served alone, in local, raw and scd modes, on the real pairs:
// hard (no shared training) and easy (a fine-tune), at head dim 8 (stories260k) and 64
// (tinystories-4m). A seeded sampled request gives the same tokens alone and in the batch. The
// consumer's scheduler must really have batched (several sequences per step).
//
// Tokens, not logits, are compared here: a batched step sums the projections in another order
// than a lone one (GEMM rows against GEMV; forward_batch_test.cc derives the bound,
// eps32 * max(hidden, intermediate) * layers of the logits' magnitude, and checks logits against
// it). Two greedy runs can then only part at a near-tie: where they part, the alone run's top two
// log-probabilities must lie within that bound (taken at a logit magnitude of 50, above these
// models'), or the test fails. Where they agree, nothing is excused.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "base/change_notice.h"
#include "calib/synthetic_artifact.h"
#include "proto/wire_mode.h"
#include "tests/serving_stack.h"
#include "tests/test_util.h"

namespace scd {
namespace {

struct Pair {
  std::string producer, consumer;
};
void PrintTo(const Pair& pair, std::ostream* os) { *os << pair.producer << " -> " << pair.consumer; }

struct Served {
  std::vector<TokenId> ids;
  std::vector<double> gaps;  // top-1 minus top-2 log-probability per token
  std::string error;
};

Served Collect(const testing::ServingReply& reply, const std::string& target) {
  Served out;
  if (!reply.status.ok()) out.error = reply.status.error_message();
  auto it = reply.events.find(target);
  if (it == reply.events.end()) return out;
  for (const v1::GenerateEvent& e : it->second) {
    if (e.has_error()) out.error = e.error().message();
    if (!e.has_token()) continue;
    for (int32_t id : e.token().ids()) out.ids.push_back(id);
    for (const v1::TokenLogprobs& lp : e.token().logprobs()) {
      out.gaps.push_back(lp.top_size() >= 2 ? lp.top(0).logprob() - lp.top(1).logprob() : 1e9);
    }
  }
  return out;
}

class BatchingTest : public ::testing::TestWithParam<Pair> {
 protected:
  void SetUp() override {
    const Pair& pair = GetParam();
    producer_ = testing::Ok(LlamaModel::Load(testing::ModelDir(pair.producer), {}));
    auto consumer = testing::Ok(LlamaModel::Load(testing::ModelDir(pair.consumer), {}));
    const ModelConfig& c = consumer->config();
    tie_ = 50 * testing::kFloat32Epsilon *
           static_cast<double>(std::max(c.hidden_size, c.intermediate_size)) *
           static_cast<double>(c.num_layers);
    SyntheticArtifactOptions synth;
    synth.key_rank = synth.value_rank = std::min<int64_t>(4, c.head_dim);
    synth.patch_layers = {1};
    synth.patch_rank = 32;
    synth.seed = 7;
    Artifact artifact = testing::Ok(SynthesizeArtifact(*producer_, *consumer, synth));
    testing::ServingStack::Options options;
    options.consumer_capacity = 16;
    options.scheduling.max_batched_tokens = 32;  // longer prompts prefill in chunks
    stack_ = std::make_unique<testing::ServingStack>(producer_.get(), nullptr, pair.producer,
                                                     options);
    stack_->AddConsumer("c", std::move(consumer), std::move(artifact));
    stack_->Start();
    const testing::Golden golden = testing::LoadGolden(pair.producer);
    for (int i = 0; i < 4; ++i) {
      std::vector<TokenId> ids = golden.prompts[i].ids;
      ids.insert(ids.end(), golden.prompts[i].greedy_40.begin(), golden.prompts[i].greedy_40.end());
      prompts_.push_back(std::vector<TokenId>(ids.begin(), ids.begin() + 8 + 9 * i));
      prompts_.push_back(std::vector<TokenId>(ids.begin(), ids.begin() + 40 - 5 * i));
    }
  }

  v1::GenerateRequest Request(const std::string& mode, size_t i) const {
    v1::GenerateRequest request;
    request.add_targets("c");
    SetRequestMode(*ParseRequestedMode(mode), &request);
    for (TokenId id : prompts_[i]) request.add_prompt_ids(id);
    request.set_max_tokens(static_cast<uint32_t>(12 + 5 * i));  // each leaves at its own length
    request.set_logprobs(2);
    return request;
  }

  std::unique_ptr<LlamaModel> producer_;
  std::unique_ptr<testing::ServingStack> stack_;
  std::vector<std::vector<TokenId>> prompts_;
  double tie_ = 0;
};

TEST_P(BatchingTest, EveryRequestInABatchGetsItsTokensServedAlone) {
  for (const std::string mode : {"local", "raw", "scd"}) {
    SCOPED_TRACE(mode);
    std::vector<Served> alone;
    for (size_t i = 0; i < prompts_.size(); ++i) {
      alone.push_back(Collect(stack_->Generate(Request(mode, i)), "c"));
      ASSERT_TRUE(alone.back().error.empty()) << alone.back().error;
    }
    const int64_t steps_before = stack_->consumer("c").scheduler->stats().steps;
    // The same requests at once, arriving 4 ms apart while the earlier ones decode.
    std::vector<Served> batched(prompts_.size());
    std::vector<std::thread> clients;
    const absl::Time begin = absl::Now();
    for (size_t i = 0; i < prompts_.size(); ++i) {
      clients.emplace_back([&, i] {
        // paces: requests arrive 4 ms apart (the scenario)
        absl::SleepFor(begin + absl::Milliseconds(4 * static_cast<int>(i)) - absl::Now());
        batched[i] = Collect(stack_->Generate(Request(mode, i)), "c");
      });
    }
    for (auto& client : clients) client.join();
    for (size_t i = 0; i < prompts_.size(); ++i) {
      ASSERT_TRUE(batched[i].error.empty()) << batched[i].error;
      ASSERT_EQ(batched[i].ids.size(), alone[i].ids.size()) << i;
      for (size_t k = 0; k < alone[i].ids.size(); ++k) {
        if (batched[i].ids[k] == alone[i].ids[k]) continue;
        // Parted: only at a near-tie of the lone run (see the file comment).
        EXPECT_LE(alone[i].gaps[k], tie_) << "request " << i << " token " << k << " of " << mode;
        break;
      }
    }
    EXPECT_GE(stack_->consumer("c").scheduler->stats().max_batch, 3) << "nothing was batched";
    EXPECT_GT(stack_->consumer("c").scheduler->stats().steps, steps_before);
  }
}

TEST_P(BatchingTest, ASeededSampledRequestGivesTheSameTokensInABatch) {
  v1::GenerateRequest sampled = Request("local", 3);
  sampled.set_temperature(0.8f);
  sampled.set_top_p(0.9f);
  sampled.set_seed(4242);
  const Served alone = Collect(stack_->Generate(sampled), "c");
  ASSERT_TRUE(alone.error.empty()) << alone.error;
  std::vector<std::thread> others;
  for (size_t i = 0; i < 5; ++i) {
    others.emplace_back([&, i] { stack_->Generate(Request(i % 2 ? "scd" : "local", i)); });
  }
  // Sent once the others run on the consumer (its scheduler's sequences are a noted change).
  AwaitChange([&] { return stack_->consumer("c").scheduler->stats().running > 0; },
              absl::Now() + absl::Seconds(30));
  const Served batched = Collect(stack_->Generate(sampled), "c");
  for (auto& t : others) t.join();
  EXPECT_EQ(batched.ids, alone.ids);
}

INSTANTIATE_TEST_SUITE_P(
    RealPairs, BatchingTest,
    ::testing::Values(Pair{"stories260k", "llama2xs-260k"}, Pair{"stories260k", "stories260k-fables"},
                      Pair{"tinystories-4m", "tinystories-4m-b"},
                      Pair{"tinystories-4m", "tinystories-4m-fables"}),
    [](const ::testing::TestParamInfo<Pair>& info) {
      std::string name = info.param.producer + "_to_" + info.param.consumer;
      for (char& c : name) {
        if (!isalnum(static_cast<unsigned char>(c))) c = '_';
      }
      return name;
    });

}  // namespace
}  // namespace scd
