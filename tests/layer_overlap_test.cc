// Layer-wise overlap is real: on a dummy-weight TinyLlama shape (4 layers) with a 512-token prompt,
// the producer's link is shaped so that sending the codes takes about as long as the prefill
// (bandwidth = payload bytes / an unshaped prefill measured here), and a request through the whole
// serving path (coordinator, producer, consumer; codes over gRPC) has
//   TTFT <= 1.15 x (max(prefill, transfer) + last layer's rebuild + first decode),
// every term from that request's own Timings (the transfer: first byte sent to last received, at
// least bytes / bandwidth) -- in scd (random orthonormal translators from SynthesizeArtifact, two
// patch layers) and in raw mode (identical weights). Without overlap the TTFT would be about
// prefill + transfer, twice the bound's main term. The transfer is the request's own, not the
// link's nominal time: under ctest -j2 a raw request's shaped sends once ran 8 % past it (2,801
// against 2,585 ms), and a bound on the nominal read 1.02.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "calib/synthetic_artifact.h"
#include "codec/code_encoder.h"
#include "codec/transfer_mode.h"
#include "codec/transfer_plan.h"
#include "proto/wire_mode.h"
#include "tests/serving_stack.h"
#include "tests/test_util.h"

namespace scd {
namespace {

constexpr int kLayers = 4;
constexpr int kPromptTokens = 512;

std::string TinyLlamaConfig() { return testing::SharedDir() + "/configs/tinyllama-1.1b.json"; }

std::vector<TokenId> LongPrompt(int64_t vocab) {
  std::vector<TokenId> prompt(kPromptTokens);
  for (int i = 0; i < kPromptTokens; ++i) prompt[i] = static_cast<TokenId>((i * 7919 + 1) % vocab);
  return prompt;
}

class LayerOverlapTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    producer_ = testing::Ok(LlamaModel::DummyFromConfig(TinyLlamaConfig(), /*seed=*/1, kLayers, {}))
                    .release();
    // Ids stream through a tokenizer as text; any tokenizer covering the 32000 ids does.
    tokenizer_ = testing::Ok(Tokenizer::FromFile(testing::SharedDir() +
                                                 "/tokenizers/gpt2-style-bytelevel.tokenizer.json"))
                     .release();
  }
  static void TearDownTestSuite() {
    delete producer_;
    delete tokenizer_;
  }

  // The unshaped prefill of the prompt's prefix capturing what `plan` encodes (what the shaper is
  // matched to), best of 2.
  static absl::Duration UnshapedPrefill(const std::vector<TokenId>& prefix,
                                        const TransferPlan& plan) {
    const CaptureSpec& capture = plan.capture;
    absl::Duration best = absl::InfiniteDuration();
    for (int i = 0; i < 2; ++i) {
      KvCache cache = producer_->NewCache(kPromptTokens);
      const absl::Time start = absl::Now();
      EXPECT_TRUE(
          producer_->Forward(prefix, &cache, {.logits = LogitsMode::kNone, .capture = &capture})
              .ok());
      best = std::min(best, absl::Now() - start);
    }
    return best;
  }

  static int64_t PlannedBytes(const TransferPlan& plan, const Artifact* artifact, int64_t tokens) {
    return TotalBytes(testing::Ok(
        CodeEncoder(plan, artifact, TransferOptions()).PlannedChunks(producer_->config(), tokens)));
  }

  // Serves `mode` to `consumer` with the producer's link matched to the prefill, then checks the
  // bound on a measured request (after one warm-up).
  void ExpectOverlap(const std::string& mode, std::unique_ptr<LlamaModel> consumer,
                     std::optional<Artifact> artifact) {
    const std::vector<TokenId> prompt = LongPrompt(producer_->config().vocab_size);
    const std::vector<TokenId> prefix(prompt.begin(), prompt.end() - 1);
    const Artifact* held = artifact ? &*artifact : nullptr;
    const TransferPlan plan = testing::Ok(TransferPlan::Make(
        testing::Ok(ParseTransferMode(mode)), producer_->config(), held, TransferOptions()));
    const int64_t bytes = PlannedBytes(plan, held, static_cast<int64_t>(prefix.size()));
    const absl::Duration prefill = UnshapedPrefill(prefix, plan);
    testing::ServingStack::Options options;
    options.producer_link.gbps =
        static_cast<double>(bytes) * 8 / absl::ToDoubleSeconds(prefill) / 1e9;
    options.deadline = absl::Seconds(120);
    testing::ServingStack stack(producer_, tokenizer_, "tinyllama-dummy", options);
    stack.AddConsumer("target", std::move(consumer), std::move(artifact));
    stack.Start();

    for (int round = 0; round < 2; ++round) {  // round 0 warms up
      testing::ServingReply reply = stack.Generate({"target"}, mode, prompt, 2);
      ASSERT_TRUE(reply.status.ok()) << reply.status.error_message();
      const v1::GenerateEvent& last = reply.events["target"].back();
      ASSERT_TRUE(last.has_finished()) << last.DebugString();
      ASSERT_EQ(RanModeName(last.finished()), mode);
      ASSERT_EQ(static_cast<int64_t>(last.finished().payload_bytes()), bytes);
      if (round == 0) continue;
      const v1::Timings& t = last.finished().timings();
      const double link_us = static_cast<double>(bytes) * 8 / (options.producer_link.gbps * 1e3);
      const double transfer_us = std::max<double>(link_us, static_cast<double>(t.transfer()));
      const double bound =
          1.15 * (std::max<double>(t.prefill(), transfer_us) + t.last_rebuild() + t.first_decode());
      std::printf(
          "%s: %lld bytes at %.4f Gbit/s (link %.0f ms, unshaped prefill %.0f ms) | served: "
          "prefill %.0f ms, transfer %.0f ms, rebuild %.0f ms (last %.1f ms, patch %.1f ms), "
          "first decode %.1f ms, TTFT %.0f ms, bound %.0f ms (TTFT / bound %.3f; without overlap "
          "~%.0f ms)\n",
          mode.c_str(), static_cast<long long>(bytes), options.producer_link.gbps, link_us / 1e3,
          absl::ToDoubleMilliseconds(prefill), t.prefill() / 1e3, t.transfer() / 1e3,
          t.rebuild() / 1e3, t.last_rebuild() / 1e3, t.patch() / 1e3, t.first_decode() / 1e3,
          t.ttft() / 1e3, bound / 1e3, t.ttft() / bound,
          (t.prefill() + link_us + t.rebuild() + t.first_decode()) / 1e3);
      EXPECT_GT(t.prefill(), 0u);
      EXPECT_GT(t.first_decode(), 0u);
      EXPECT_LE(static_cast<double>(t.ttft()), bound);
    }
  }

  static LlamaModel* producer_;
  static Tokenizer* tokenizer_;
};

LlamaModel* LayerOverlapTest::producer_ = nullptr;
Tokenizer* LayerOverlapTest::tokenizer_ = nullptr;

TEST_F(LayerOverlapTest, ScdTtftIsBoundedByTheSlowerOfPrefillAndTransfer) {
  auto consumer =
      testing::Ok(LlamaModel::DummyFromConfig(TinyLlamaConfig(), /*seed=*/2, kLayers, {}));
  SyntheticArtifactOptions synth;
  synth.key_rank = 32;
  synth.value_rank = 32;
  synth.patch_layers = {1, 3};
  synth.patch_rank = 128;
  Artifact artifact = testing::Ok(SynthesizeArtifact(*producer_, *consumer, synth));
  ExpectOverlap("scd", std::move(consumer), std::move(artifact));
}

TEST_F(LayerOverlapTest, RawTtftIsBoundedByTheSlowerOfPrefillAndTransfer) {
  ExpectOverlap(
      "raw", testing::Ok(LlamaModel::DummyFromConfig(TinyLlamaConfig(), /*seed=*/1, kLayers, {})),
      std::nullopt);
}

}  // namespace
}  // namespace scd
