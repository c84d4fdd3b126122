// The serving path in one process, every hop real: a coordinator, a producer and consumers, each a
// gRPC server on loopback, codes over the gRPC transport. Through the coordinator's public
// Inference API: greedy tokens equal the batch transfer path (whole batch, batch decoder,
// GenerateTokens: what `scd-calib generate` runs) for the same pair and mode; raw between
// identical models equals the consumer's local generation; a fan-out to two consumers runs one
// prefill and both streams match their single-target references; 16 concurrent requests all
// complete, none mixed up; a full consumer refuses before anything is prefilled or sent; a request
// cancelled mid-transfer leaves the next one on that consumer exact; 1-token and maximum-length
// prompts complete (one more token is OUT_OF_RANGE); unknown targets are NOT_FOUND naming the
// known ones.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/change_notice.h"
#include "codec/transfer.h"
#include "model/generator.h"
#include "proto/frontier_proto.h"
#include "proto/requested_point.h"
#include "proto/wire_mode.h"
#include "tests/serving_stack.h"
#include "tests/test_util.h"

namespace scd {
namespace {

using ::testing::HasSubstr;

std::vector<TokenId> Prompt(int i) { return testing::LoadGolden("stories260k").prompts[i].ids; }

class ServingTest : public ::testing::Test {
 protected:
  using Reply = testing::ServingReply;

  void SetUp() override {
    producer_ = testing::Ok(LlamaModel::Load(testing::ModelDir("stories260k"), {}));
    tokenizer_ =
        testing::Ok(Tokenizer::FromFile(testing::ModelDir("stories260k") + "/tokenizer.json"));
    StartStack(testing::ServingStack::Options());
  }

  void StartStack(testing::ServingStack::Options options) {
    stack_.reset();
    stack_ = std::make_unique<testing::ServingStack>(producer_.get(), tokenizer_.get(),
                                                     "stories260k", std::move(options));
    AddConsumer("xs", "llama2xs-260k", true);
    AddConsumer("fables", "stories260k-fables", true);
    AddConsumer("base-copy", "stories260k", false);
    stack_->Start();
  }

  void AddConsumer(const std::string& name, const std::string& dir, bool with_artifact) {
    std::optional<Artifact> artifact;
    if (with_artifact) artifact = testing::SyntheticArtifact(*producer_);
    if (name == "xs") artifact->frontier = XsFrontier();
    stack_->AddConsumer(name, testing::Ok(LlamaModel::Load(testing::ModelDir(dir), {})),
                        std::move(artifact));
  }

  // A stack (`options`, its producer's link shaped here) and a request on which auto must lower
  // xs's later ranks: a consumer far slower than its producer, a link of 12.5 kB/s that the
  // coordinator knows:
  // auto sends xs's f16 point (within max_kl 0.06) as the fastest, though no choice meets 1 ms.
  // Its first decode step alone (5 ms) is past the objective, so the codes' delivery deadline
  // is gone before the first layer is ready: the producer lowers what the link cannot carry in
  // the pass's own time, the last layer at least.
  v1::GenerateRequest StartLoweringStack(testing::ServingStack::Options options) {
    options.producer_link.gbps = 0.0001;
    options.producer_link.burst_bytes = 1;
    StartStack(options);
    v1::NodeSpeeds producer, consumer;
    producer.mutable_prefill()->set_per_unit_us(1);
    producer.mutable_prefill()->set_samples(4);
    consumer.mutable_prefill()->set_per_unit_us(100'000);
    consumer.mutable_prefill()->set_samples(4);
    consumer.mutable_first_decode()->set_fixed_us(5000);
    consumer.mutable_first_decode()->set_samples(4);
    stack_->ReportSpeeds("", producer);
    stack_->ReportSpeeds("xs", consumer);
    v1::LinkShape slow;
    slow.set_gbps(0.0001);
    stack_->NoteLinkShape(slow);
    v1::GenerateRequest request;
    request.add_targets("xs");
    for (TokenId id : Prompt(2)) request.add_prompt_ids(id);
    request.set_max_tokens(16);
    request.set_max_kl(0.06);
    request.set_ttft_slo_ms(1);
    return request;
  }

  // xs's frontier (the synthetic artifact: r_K 2, r_V 3 on layers 0, 2, 4; r_H 5 on 1 and 3):
  // int4 at the lowest ranks, int8 lowered, the fitted configuration; the KLs are made up (the
  // routing only reads them), the middle point recommended.
  static Frontier XsFrontier() {
    Frontier f;
    auto point = [](WireDtype dtype, int64_t k, int64_t v, int64_t h, double bytes, double kl) {
      FrontierPoint p;
      p.code_dtype = dtype;
      p.rank_k = {k, 0, k, 0, k};
      p.rank_v = {v, 0, v, 0, v};
      p.rank_h = {0, h, 0, h, 0};
      p.bytes_per_token = bytes;
      p.kl = kl;
      return p;
    };
    f.points = {point(WireDtype::kInt4, 1, 1, 2, 10, 0.3),
                point(WireDtype::kInt8, 1, 2, 4, 40, 0.1),
                point(WireDtype::kF16, 2, 3, 5, 140, 0.05)};
    f.recommended = 1;
    return f;
  }

  // Greedy continuation of `prompt` on consumer `name` via the batch path (`transfer`: the
  // options codes are sent at).
  std::vector<TokenId> Reference(const std::string& name, TransferMode mode,
                                 const std::vector<TokenId>& prompt, int max_tokens,
                                 const TransferOptions& transfer = TransferOptions()) {
    const testing::ServedConsumer& node = stack_->consumer(name);
    KvCache cache = node.model->NewCache(64);
    if (mode != TransferMode::kLocal) {
      const Artifact* artifact = ModeServedWithArtifact(mode) ? node.artifact : nullptr;
      TransferPath path =
          testing::Ok(TransferPath::Create(mode, *producer_, *node.model, artifact, transfer));
      const std::vector<TokenId> prefix(prompt.begin(), prompt.end() - 1);
      EXPECT_TRUE(path.Run(prefix, &cache, InProcessHandOff()).ok());
    }
    GenerationOptions options;
    options.max_tokens = max_tokens;
    return testing::Ok(GenerateTokens(*node.model, prompt, &cache, options)).output_ids;
  }

  Reply Generate(const std::vector<std::string>& targets, const std::string& mode,
                 const std::vector<TokenId>& prompt, int max_tokens) {
    return stack_->Generate(targets, mode, prompt, max_tokens);
  }

  std::unique_ptr<LlamaModel> producer_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<testing::ServingStack> stack_;
};

TEST_F(ServingTest, ScdThroughTheCoordinatorEqualsTheBatchTransferPath) {
  Reply reply = Generate({"xs"}, "scd", Prompt(2), 16);
  ASSERT_TRUE(reply.status.ok()) << reply.status.error_message();
  const auto& events = reply.events["xs"];
  ASSERT_TRUE(events.back().has_finished()) << events.back().DebugString();
  EXPECT_EQ(RanModeName(events.front().started()), "scd");
  EXPECT_EQ(RanModeName(events.back().finished()), "scd");
  EXPECT_GT(events.back().finished().payload_bytes(), 0u);
  EXPECT_EQ(events.front().started().expected_payload_bytes(),
            events.back().finished().payload_bytes());
  const v1::Timings& t = events.back().finished().timings();
  EXPECT_GT(t.last_rebuild(), 0u);
  EXPECT_LT(t.last_rebuild(), t.ttft());
  EXPECT_GT(t.patch(), 0u);  // the synthetic artifact has patch layers
  EXPECT_LE(t.patch(), t.rebuild());
  EXPECT_GT(t.prefill(), 0u);  // the producer's, filled in by the coordinator
  EXPECT_GT(t.rebuild(), 0u);
  EXPECT_GT(t.ttft(), 0u);
  EXPECT_GE(t.total(), t.ttft());
  // Per layer (the sweep's pipeline term, codec/ttft_model.h): the producer had every layer's
  // codes out in layer order within its pass, and the consumer's per-layer rebuilds are the
  // parts of its whole rebuild that codes set off (a recomputed run, if any, is the rest).
  const int layers = static_cast<int>(producer_->config().num_layers);
  ASSERT_EQ(t.layer_codes_size(), layers);
  for (int l = 1; l < layers; ++l) EXPECT_GE(t.layer_codes(l), t.layer_codes(l - 1)) << l;
  EXPECT_LE(t.layer_codes(layers - 1), t.prefill());
  ASSERT_GT(t.layer_rebuild_size(), 0);
  EXPECT_LE(t.layer_rebuild_size(), layers);
  uint64_t per_layer = 0;
  for (uint64_t us : t.layer_rebuild()) per_layer += us;
  EXPECT_GT(per_layer, 0u);
  EXPECT_LE(per_layer, t.rebuild() + t.layer_rebuild_size());  // each rounded to 1 us
  EXPECT_EQ(reply.ids["xs"], Reference("xs", TransferMode::kScd, Prompt(2), 16));
}

// The API's logprobs (issue 16): every generated position carries k candidates, the first of
// which is the greedy token, and the tokens are those of a request without logprobs.
// A request's mode is read once in the whole deployment (all of it in this process): at the
// coordinator's front, from the deprecated string when a client of the last release sends one;
// from there on the enum travels (the control messages and the events carry it) and no node parses
// a name again. A client that sends the enum causes no parse at all.
TEST_F(ServingTest, AModeNameIsParsedOnceInTheWholeDeployment) {
  v1::GenerateRequest request;
  for (TokenId id : Prompt(2)) request.add_prompt_ids(id);
  request.add_targets("xs");
  request.set_max_tokens(4);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  request.set_mode("scd");  // as a client of the last release
#pragma GCC diagnostic pop
  int64_t before = ModeNamesParsed();
  Reply reply = stack_->Generate(request);
  ASSERT_TRUE(reply.status.ok()) << reply.status.error_message();
  ASSERT_TRUE(reply.events["xs"].back().has_finished());
  EXPECT_EQ(RanMode(reply.events["xs"].back().finished()), TransferMode::kScd);
  EXPECT_EQ(ModeNamesParsed() - before, 1);

  SetRequestMode(TransferMode::kScd, &request);
  before = ModeNamesParsed();
  reply = stack_->Generate(request);
  ASSERT_TRUE(reply.status.ok()) << reply.status.error_message();
  EXPECT_EQ(RanMode(reply.events["xs"].back().finished()), TransferMode::kScd);
  EXPECT_EQ(ModeNamesParsed() - before, 0);
}

// A text prompt is tokenized once in the whole deployment (all of it in this process): at the
// coordinator's front; its consumer and its producer get the ids. The continuation is the one the
// ids would give.
TEST_F(ServingTest, ATextPromptIsTokenizedOnceInTheWholeDeployment) {
  v1::GenerateRequest request;
  request.set_prompt("Once upon a time, there was a little girl");
  request.add_targets("xs");
  request.set_max_tokens(6);
  SetRequestMode(TransferMode::kScd, &request);
  const int64_t before = Tokenizer::TextsEncoded();
  Reply reply = stack_->Generate(request);
  ASSERT_TRUE(reply.status.ok()) << reply.status.error_message();
  ASSERT_TRUE(reply.events["xs"].back().has_finished());
  EXPECT_EQ(Tokenizer::TextsEncoded() - before, 1);
  const std::vector<TokenId> ids = testing::Ok(tokenizer_->Encode(request.prompt()));
  EXPECT_EQ(reply.events["xs"].back().finished().prompt_tokens(), ids.size());
  EXPECT_EQ(reply.ids["xs"], Reference("xs", TransferMode::kScd, ids, 6));
}

TEST_F(ServingTest, LogprobsTopOneIsTheGreedyTokenAtEveryPosition) {
  v1::GenerateRequest request;
  for (TokenId id : Prompt(3)) request.add_prompt_ids(id);
  request.add_targets("xs");
  SetRequestMode(*ParseRequestedMode("scd"), &request);
  request.set_max_tokens(20);
  request.set_logprobs(4);
  Reply reply = stack_->Generate(request);
  ASSERT_TRUE(reply.status.ok()) << reply.status.error_message();
  size_t positions = 0;
  for (const v1::GenerateEvent& e : reply.events["xs"]) {
    if (!e.has_token()) continue;
    ASSERT_EQ(e.token().logprobs_size(), e.token().ids_size());
    for (int i = 0; i < e.token().ids_size(); ++i) {
      const v1::TokenLogprobs& lp = e.token().logprobs(i);
      EXPECT_EQ(lp.id(), e.token().ids(i));
      ASSERT_EQ(lp.top_size(), 4);
      EXPECT_EQ(lp.top(0).id(), e.token().ids(i)) << "position " << positions;
      EXPECT_EQ(lp.top(0).logprob(), lp.logprob());
      for (int j = 1; j < 4; ++j) EXPECT_LE(lp.top(j).logprob(), lp.top(j - 1).logprob());
      ++positions;
    }
  }
  EXPECT_EQ(positions, reply.ids["xs"].size());
  EXPECT_GT(positions, 0u);
  EXPECT_EQ(reply.ids["xs"], Reference("xs", TransferMode::kScd, Prompt(3), 20));
  // Past the bound of 20: refused as a whole, naming the field.
  request.set_logprobs(21);
  Reply refused = stack_->Generate(request);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_THAT(refused.status.error_message(), HasSubstr("logprobs"));
}

// Recompute takes its layer list from the pair's artifact: through the coordinator it needs the
// artifact routed like reuse and scd (it was refused for want of layers before issue 16's sweep).
TEST_F(ServingTest, RecomputeThroughTheCoordinatorEqualsTheBatchTransferPath) {
  Reply reply = Generate({"xs"}, "recompute", Prompt(1), 12);
  ASSERT_TRUE(reply.status.ok()) << reply.status.error_message();
  ASSERT_TRUE(reply.events["xs"].back().has_finished()) << reply.events["xs"].back().DebugString();
  EXPECT_EQ(RanModeName(reply.events["xs"].back().finished()), "recompute");
  EXPECT_EQ(reply.ids["xs"], Reference("xs", TransferMode::kRecompute, Prompt(1), 12));
  // A consumer without the pair's artifact cannot serve it: refused before any work.
  Reply refused = Generate({"base-copy"}, "recompute", Prompt(1), 4);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << refused.status.error_message();
}

TEST_F(ServingTest, RawBetweenIdenticalModelsEqualsLocalGeneration) {
  Reply reply = Generate({"base-copy"}, "", Prompt(1), 16);  // auto: identical weights -> raw
  ASSERT_TRUE(reply.status.ok()) << reply.status.error_message();
  EXPECT_EQ(RanModeName(reply.events["base-copy"].front().started()), "raw");
  EXPECT_EQ(reply.ids["base-copy"], Reference("base-copy", TransferMode::kLocal, Prompt(1), 16));
}

// Issue 29: auto on a pair with a frontier sends the point its quality budget picks (the
// recommended one without a budget, local prefill when none is within it), and the tokens are
// those of that configuration run through the batch path; explicit scd keeps the fitted one.
// Issue 29: with the nodes' speeds reported, auto predicts each choice's TTFT and takes the
// fastest within the budget; the tokens are those of the chosen configuration requested
// explicitly, and Finished carries the prediction.
TEST_F(ServingTest, AutoChoosesByPredictedTtftAndTheTokensAreThatChoices) {
  auto speeds = [](double producer_us_per_token, double consumer_us_per_token) {
    v1::NodeSpeeds producer, consumer;
    producer.mutable_prefill()->set_per_unit_us(producer_us_per_token);
    producer.mutable_prefill()->set_samples(4);
    consumer.mutable_prefill()->set_per_unit_us(consumer_us_per_token);
    consumer.mutable_prefill()->set_samples(4);
    return std::make_pair(producer, consumer);
  };
  v1::GenerateRequest request;
  request.add_targets("xs");
  for (TokenId id : Prompt(2)) request.add_prompt_ids(id);
  request.set_max_tokens(16);
  // A consumer far slower than its producer: the recommended point is clearly the fastest.
  auto [fast_producer, slow_consumer] = speeds(1, 100'000);
  stack_->ReportSpeeds("", fast_producer);
  stack_->ReportSpeeds("xs", slow_consumer);
  Reply reply = stack_->Generate(request);
  ASSERT_TRUE(reply.status.ok()) << reply.status.error_message();
  const v1::Started& sent = reply.events["xs"].front().started();
  const v1::Finished& sent_end = reply.events["xs"].back().finished();
  EXPECT_EQ(RanModeName(sent), "scd");
  EXPECT_THAT(sent.mode_reason(), HasSubstr("auto: scd point #1 int8"));
  EXPECT_THAT(sent.mode_reason(), HasSubstr("runner-up"));
  EXPECT_GT(sent_end.predicted_ttft_us(), 0u);
  EXPECT_EQ(reply.ids["xs"], Reference("xs", TransferMode::kScd, Prompt(2), 16,
                                       TransferOptions::AtPoint(XsFrontier().points[1])));
  // A producer far slower than the consumer: local prefill, said so, and local's tokens.
  auto [slow_producer, fast_consumer] = speeds(100'000, 1);
  stack_->ReportSpeeds("", slow_producer);
  stack_->ReportSpeeds("xs", fast_consumer);
  reply = stack_->Generate(request);
  ASSERT_TRUE(reply.status.ok()) << reply.status.error_message();
  const v1::Started& local = reply.events["xs"].front().started();
  const v1::Finished& local_end = reply.events["xs"].back().finished();
  EXPECT_EQ(RanModeName(local), "local");
  EXPECT_THAT(local.mode_reason(), HasSubstr("auto: local prefill predicted"));
  EXPECT_THAT(local.mode_reason(), HasSubstr("runner-up scd point"));
  EXPECT_EQ(RanModeName(local_end), "local");
  EXPECT_GT(local_end.predicted_ttft_us(), 0u);
  EXPECT_EQ(reply.ids["xs"], Reference("xs", TransferMode::kLocal, Prompt(2), 16));
  // An explicit mode predicts nothing.
  reply = Generate({"xs"}, "local", Prompt(2), 4);
  ASSERT_TRUE(reply.status.ok());
  EXPECT_EQ(reply.events["xs"].back().finished().predicted_ttft_us(), 0u);
}

TEST_F(ServingTest, AutoLowersLaterRanksWhenTheLinkCannotMeetItsSloAndSaysWhich) {
  v1::GenerateRequest request = StartLoweringStack({});
  Reply reply = stack_->Generate(request);
  ASSERT_TRUE(reply.status.ok()) << reply.status.error_message();
  const v1::Finished& adapted = reply.events["xs"].back().finished();
  ASSERT_EQ(RanModeName(adapted), "scd") << adapted.mode_reason();
  const FrontierPoint chosen = XsFrontier().points[2];  // K 2, V 3 on 0, 2, 4; H 5 on 1, 3
  FrontierPoint sent = chosen;
  std::vector<uint32_t> layers;
  for (const v1::LoweredLayer& l : adapted.lowered_layers()) {
    layers.push_back(l.layer());
    EXPECT_GT(l.rank_k() + l.rank_v() + l.rank_h(), 0u) << l.layer();
    sent.rank_k[l.layer()] = l.rank_k() > 0 ? l.rank_k() : sent.rank_k[l.layer()];
    sent.rank_v[l.layer()] = l.rank_v() > 0 ? l.rank_v() : sent.rank_v[l.layer()];
    sent.rank_h[l.layer()] = l.rank_h() > 0 ? l.rank_h() : sent.rank_h[l.layer()];
  }
  ASSERT_FALSE(layers.empty());
  EXPECT_EQ(layers.back(), 4u);  // no time left at the last layer: its codes at rank 1
  EXPECT_EQ(sent.rank_k[4], 1);
  EXPECT_EQ(sent.rank_v[4], 1);
  for (size_t l = 0; l < 5; ++l) {
    EXPECT_LE(sent.rank_k[l], chosen.rank_k[l]);
    EXPECT_LE(sent.rank_v[l], chosen.rank_v[l]);
    EXPECT_LE(sent.rank_h[l], chosen.rank_h[l]);
  }
  EXPECT_THAT(adapted.mode_reason(), HasSubstr("the link fell behind: layer"));
  EXPECT_THAT(adapted.mode_reason(), HasSubstr("4 (K 1, V 1) sent at lower ranks"));
  // The tokens are those of the point at the ranks that arrived.
  EXPECT_EQ(reply.ids["xs"],
            Reference("xs", TransferMode::kScd, Prompt(2), 16, TransferOptions::AtPoint(sent)));
  // keep_ranks: the point as chosen, whatever the link.
  request.set_keep_ranks(true);
  reply = stack_->Generate(request);
  ASSERT_TRUE(reply.status.ok()) << reply.status.error_message();
  EXPECT_EQ(reply.events["xs"].back().finished().lowered_layers_size(), 0);
  EXPECT_EQ(reply.ids["xs"], Reference("xs", TransferMode::kScd, Prompt(2), 16,
                                       TransferOptions::AtPoint(XsFrontier().points[2])));
}

// Found by the soak (bench/soak.h): a prefix rebuilt from codes that arrived below the point's
// ranks went into the consumer's prefix cache under the point's scope, and later requests at
// that point reused the degraded blocks (their tokens parted from the point's). Now such a
// rebuild is never kept; a rebuild at the point's ranks is, and serves the next request exactly.
TEST_F(ServingTest, APrefixRebuiltFromLoweredCodesIsNotKeptForLaterRequests) {
  testing::ServingStack::Options options;
  options.consumer_prefix_cache_bytes = 64 << 20;
  v1::GenerateRequest request = StartLoweringStack(options);
  Reply lowered = stack_->Generate(request);
  ASSERT_TRUE(lowered.status.ok()) << lowered.status.error_message();
  ASSERT_GT(lowered.events["xs"].back().finished().lowered_layers_size(), 0);
  const std::vector<TokenId> at_point = Reference("xs", TransferMode::kScd, Prompt(2), 16,
                                                  TransferOptions::AtPoint(XsFrontier().points[2]));
  request.set_keep_ranks(true);
  for (const uint32_t cached : {0u, 16u}) {  // the 31-position prefix holds one 16-token block
    const Reply kept = stack_->Generate(request);
    ASSERT_TRUE(kept.status.ok()) << kept.status.error_message();
    const v1::Finished& finished = kept.events.at("xs").back().finished();
    EXPECT_EQ(finished.lowered_layers_size(), 0);
    EXPECT_EQ(finished.consumer_cached_tokens(), cached);
    EXPECT_EQ(kept.ids.at("xs"), at_point) << "consumer cached " << cached;
  }
}

TEST_F(ServingTest, AutoSendsTheFrontierPointItsBudgetPicks) {
  const Frontier frontier = XsFrontier();
  struct Case {
    double max_kl;
    int point;  // -1: local prefill
  };
  for (const Case& c : {Case{0, 1}, Case{0.35, 0}, Case{0.06, 2}, Case{0.01, -1}}) {
    v1::GenerateRequest request;
    request.add_targets("xs");
    for (TokenId id : Prompt(2)) request.add_prompt_ids(id);
    request.set_max_tokens(16);
    request.set_max_kl(c.max_kl);
    Reply reply = stack_->Generate(request);
    ASSERT_TRUE(reply.status.ok()) << reply.status.error_message();
    const v1::Started& started = reply.events["xs"].front().started();
    const v1::Finished& finished = reply.events["xs"].back().finished();
    if (c.point < 0) {
      EXPECT_EQ(RanModeName(started), "local") << c.max_kl;
      EXPECT_THAT(started.mode_reason(), HasSubstr("is within max_kl 0.01"));
      EXPECT_EQ(reply.ids["xs"], Reference("xs", TransferMode::kLocal, Prompt(2), 16));
      continue;
    }
    const FrontierPoint& p = frontier.points[c.point];
    EXPECT_EQ(RanModeName(started), "scd") << c.max_kl;
    EXPECT_THAT(started.mode_reason(), HasSubstr(absl::StrCat("frontier point #", c.point)));
    EXPECT_EQ(started.point().code_dtype(), WireDtypeName(p.code_dtype));
    EXPECT_EQ(
        std::vector<int64_t>(started.point().rank_h().begin(), started.point().rank_h().end()),
        p.rank_h);
    EXPECT_DOUBLE_EQ(started.expected_kl(), p.kl);
    // What travelled is that point's payload, and the tokens are that configuration's.
    EXPECT_EQ(started.expected_payload_bytes(), finished.payload_bytes());
    EXPECT_EQ(reply.ids["xs"],
              Reference("xs", TransferMode::kScd, Prompt(2), 16, TransferOptions::AtPoint(p)))
        << c.max_kl;
  }
  // The points differ in what they send: the cheaper, the fewer bytes.
  v1::GenerateRequest low, high;
  for (v1::GenerateRequest* r : {&low, &high}) {
    r->add_targets("xs");
    for (TokenId id : Prompt(2)) r->add_prompt_ids(id);
    r->set_max_tokens(2);
  }
  low.set_max_kl(0.35);
  high.set_max_kl(0.06);
  EXPECT_LT(stack_->Generate(low).events["xs"].back().finished().payload_bytes(),
            stack_->Generate(high).events["xs"].back().finished().payload_bytes());
  // Explicit scd without a budget: the fitted configuration, no point named.
  Reply scd = Generate({"xs"}, "scd", Prompt(2), 16);
  EXPECT_FALSE(scd.events["xs"].front().started().has_point());
  EXPECT_EQ(scd.ids["xs"], Reference("xs", TransferMode::kScd, Prompt(2), 16));
  // A budget no point meets refuses explicit scd before any work; a budget for raw is refused
  // by validation, naming the field.
  v1::GenerateRequest strict;
  strict.add_targets("xs");
  strict.set_prompt("Once upon a time");
  SetRequestMode(*ParseRequestedMode("scd"), &strict);
  strict.set_max_kl(0.01);
  Reply refused = stack_->Generate(strict);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(refused.status.error_message(), HasSubstr("max_kl: no point"));
  SetRequestMode(*ParseRequestedMode("raw"), &strict);
  refused = stack_->Generate(strict);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.status.error_message(), HasSubstr("max_kl"));
}

// What producer and consumer do with the point a control call names: the coordinator's points
// pass, anything their artifact cannot send is INVALID_ARGUMENT starting "point: ".
TEST_F(ServingTest, APointTheArtifactCannotSendIsRefused) {
  const Artifact* artifact = stack_->consumer("xs").artifact;
  const v1::CodePoint good = CodePointToProto(XsFrontier().points[0]);
  EXPECT_TRUE(RequestedPoint(good, TransferMode::kScd, artifact, "a").ok());
  std::vector<std::pair<std::string, v1::CodePoint>> bad;
  v1::CodePoint p = good;
  p.set_code_dtype("int3");
  bad.emplace_back("int3", p);
  p = good;
  p.set_rank_v(0, 4);  // above the artifact's r_V 3
  bad.emplace_back("outside", p);
  p = good;
  p.set_rank_k(1, 1);  // a key code on patch layer 1
  bad.emplace_back("layer 1", p);
  p = good;
  p.add_rank_h(1);  // lists of different lengths
  bad.emplace_back("ranks for", p);
  p = good;
  p.set_rank_h(1, 1u << 20);
  bad.emplace_back("at most", p);
  for (const auto& [what, point] : bad) {
    absl::StatusOr<FrontierPoint> r = RequestedPoint(point, TransferMode::kScd, artifact, "a");
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << what;
    EXPECT_THAT(r.status().message(), HasSubstr("point: ")) << what;
    EXPECT_THAT(r.status().message(), HasSubstr(what)) << r.status();
  }
  EXPECT_THAT(RequestedPoint(good, TransferMode::kRaw, nullptr, "").status().message(),
              HasSubstr("for mode scd, not raw"));
}

TEST_F(ServingTest, FanOutRunsOnePrefillAndMatchesBothSingleTargetReferences) {
  const uint64_t before = stack_->producer_service().prefills();
  Reply reply = Generate({"fables", "xs"}, "scd", Prompt(3), 16);
  ASSERT_TRUE(reply.status.ok()) << reply.status.error_message();
  EXPECT_EQ(stack_->producer_service().prefills(), before + 1);
  EXPECT_EQ(reply.ids["fables"], Reference("fables", TransferMode::kScd, Prompt(3), 16));
  EXPECT_EQ(reply.ids["xs"], Reference("xs", TransferMode::kScd, Prompt(3), 16));
}

TEST_F(ServingTest, SixteenConcurrentRequestsAllCompleteUnmixed) {
  struct Case {
    std::string target;
    int prompt;
    int max_tokens;
  };
  std::vector<Case> cases;
  for (int i = 0; i < 16; ++i) {
    cases.push_back({i % 2 ? "xs" : "fables", i % 4, 8 + i});
  }
  std::vector<Reply> replies(cases.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < cases.size(); ++i) {
    clients.emplace_back([&, i] {
      replies[i] = Generate({cases[i].target}, "scd", Prompt(cases[i].prompt), cases[i].max_tokens);
    });
  }
  for (auto& client : clients) client.join();
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_TRUE(replies[i].status.ok()) << i << ": " << replies[i].status.error_message();
    ASSERT_TRUE(replies[i].events[cases[i].target].back().has_finished()) << i;
    EXPECT_EQ(replies[i].ids[cases[i].target],
              Reference(cases[i].target, TransferMode::kScd, Prompt(cases[i].prompt),
                        cases[i].max_tokens))
        << "request " << i;
  }
}

// Without early prefill the producer never works for a request its consumer refuses; with it
// (the default) the producer's Prefill, started with the Decode, is cancelled and its session
// refused or ended by the consumer, none kept waiting for a request that will not come.
TEST_F(ServingTest, FullConsumerRefusesBeforeTheProducerSends) {
  for (const bool early : {false, true}) {
    testing::ServingStack::Options options;
    options.early_prefill = early;
    StartStack(options);
    std::vector<std::unique_ptr<consumer::Admission::Reservation>> held;
    for (int i = 0; i < 16; ++i)
      held.push_back(testing::Ok(stack_->consumer("xs").admission->Admit()));
    const uint64_t before = stack_->producer_service().prefills();
    Reply reply = Generate({"xs"}, "scd", Prompt(2), 8);
    // Refused as a whole (inference.proto): the call's status, no event.
    EXPECT_EQ(reply.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << early;
    EXPECT_TRUE(reply.events["xs"].empty());
    if (!early) {
      EXPECT_EQ(stack_->producer_service().prefills(), before);  // nothing sent
    }
    // The consumer expected the session from the Decode's arrival to its refusal: one that came
    // first was taken then, one that comes later is refused at once.
    EXPECT_EQ(stack_->consumer("xs").router->early(), 0u);
    held.clear();
    const Reply next = Generate({"xs"}, "scd", Prompt(2), 8);
    ASSERT_FALSE(next.events.at("xs").empty());
    EXPECT_TRUE(next.events.at("xs").back().has_finished()) << early;
    EXPECT_EQ(next.ids.at("xs"), Reference("xs", TransferMode::kScd, Prompt(2), 8)) << early;
  }
}

// Early prefills for requests their consumer must queue: the producer must not work for them
// while they hold no slot. Before, each such pass held one of the producer's prefill threads
// waiting for its session's ack, and with every thread so held the requests already admitted
// waited behind them for their sessions (the soak smoke's 5-s stalls). Now the consumer declines
// the early prefill (refuses the early session), the producer's threads stay free while the
// requests wait, and once admitted each runs as without early prefill, exact.
TEST_F(ServingTest, EarlyPrefillsForQueuedRequestsLeaveTheProducerFree) {
  constexpr int kThreads = 2;  // the producer's prefill threads: as many requests queue
  testing::ServingStack::Options options;
  options.early_prefill = true;
  options.consumer_max_queued = 4;
  options.producer_prefill_threads = kThreads;
  StartStack(options);
  consumer::Admission& xs = *stack_->consumer("xs").admission;
  std::vector<std::unique_ptr<consumer::Admission::Reservation>> held;
  for (int i = 0; i < 16; ++i) held.push_back(testing::Ok(xs.Admit()));
  Reply queued[kThreads];
  std::vector<std::thread> clients;
  struct Joined {  // whatever fails below, the queued requests are let in and their clients joined
    std::vector<std::unique_ptr<consumer::Admission::Reservation>>* held;
    std::vector<std::thread>* clients;
    ~Joined() {
      held->clear();
      for (std::thread& c : *clients) c.join();
    }
  } joined{&held, &clients};
  for (int i = 0; i < kThreads; ++i) {
    clients.emplace_back([&, i] { queued[i] = Generate({"xs"}, "scd", Prompt(i), 8); });
  }
  ASSERT_TRUE(
      AwaitChange([&] { return xs.queued() == kThreads; }, absl::Now() + absl::Seconds(30)));
  // Another consumer's request needs one of the producer's prefill threads: the queued requests
  // hold none (before, it waited until their deadline took them out of the queue).
  Reply other = Generate({"fables"}, "scd", Prompt(2), 8);
  ASSERT_FALSE(other.events.at("fables").empty());
  EXPECT_TRUE(other.events.at("fables").back().has_finished());
  EXPECT_FALSE(other.ids["fables"].empty());
  EXPECT_EQ(other.ids["fables"], Reference("fables", TransferMode::kScd, Prompt(2), 8));
  EXPECT_EQ(xs.queued(), static_cast<uint32_t>(kThreads));  // still waiting
  EXPECT_EQ(stack_->consumer("xs").control->tally()->Get("early_prefill_declined"),
            static_cast<uint64_t>(kThreads));
  EXPECT_EQ(stack_->consumer("xs").router->early(), 0u);
  held.clear();
  for (std::thread& c : clients) c.join();
  clients.clear();
  for (int i = 0; i < kThreads; ++i) {
    const auto& events = queued[i].events["xs"];
    ASSERT_FALSE(events.empty()) << queued[i].status.error_message();
    ASSERT_TRUE(events.front().has_started());
    EXPECT_FALSE(events.front().started().early_prefill_declined());  // the coordinator's own
    EXPECT_EQ(RanModeName(events.front().started()), "scd");
    ASSERT_TRUE(events.back().has_finished()) << events.back().DebugString();
    EXPECT_EQ(queued[i].ids["xs"], Reference("xs", TransferMode::kScd, Prompt(i), 8)) << i;
  }
}

TEST_F(ServingTest, CancelledRequestLeavesTheNextOneOnTheConsumerExact) {
  for (int attempt = 0; attempt < 3; ++attempt) {
    v1::GenerateRequest request;
    request.add_targets("xs");
    SetRequestMode(*ParseRequestedMode("scd"), &request);
    for (TokenId id : Prompt(3)) request.add_prompt_ids(id);
    request.set_max_tokens(200);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    auto reader = stack_->stub().Generate(&context, request);
    v1::GenerateEvent event;
    ASSERT_TRUE(reader->Read(&event));  // Started: admitted, transfer under way
    context.TryCancel();
    while (reader->Read(&event)) {
    }
    reader->Finish();
    Reply next = Generate({"xs"}, "scd", Prompt(2), 16);
    ASSERT_TRUE(next.status.ok()) << next.status.error_message();
    EXPECT_EQ(next.ids["xs"], Reference("xs", TransferMode::kScd, Prompt(2), 16));
  }
  // Every slot comes back (each request's end releases it; 30 s: only a guard against a hang).
  EXPECT_TRUE(stack_->consumer("xs").admission->AwaitIdle(absl::Now() + absl::Seconds(30)));
}

// A consumer that is gone (its transfer listener and connections closed, as when it is killed and
// comes back at another address) must not leave its connection, and that connection's threads, in
// the producer's cache for good: the next session the producer opens, to anyone, drops it. The soak
// found the producer's threads growing with each consumer restart.
TEST_F(ServingTest, TheProducerDropsTheConnectionOfAConsumerThatIsGone) {
  ASSERT_TRUE(Generate({"fables"}, "scd", Prompt(1), 4).events["fables"].back().has_finished());
  ASSERT_TRUE(Generate({"xs"}, "scd", Prompt(1), 4).events["xs"].back().has_finished());
  ASSERT_EQ(stack_->producer_service().connections(), 2u);
  stack_->consumer("fables").router.reset();  // its listener and connections close
  const absl::Time limit = absl::Now() + absl::Seconds(10);
  size_t held = 2;
  while (held > 1 && absl::Now() < limit) {
    Reply reply = Generate({"xs"}, "scd", Prompt(2), 8);
    ASSERT_TRUE(reply.status.ok()) << reply.status.error_message();
    EXPECT_EQ(reply.ids["xs"], Reference("xs", TransferMode::kScd, Prompt(2), 8));
    held = stack_->producer_service().connections();
    // waits: the producer drops a dead connection only when its next session opens, so each retry
    //  is a request; no event says it saw the link down
    if (held > 1) absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(held, 1u) << "the gone consumer's connection is still held after 10 s";
}

TEST_F(ServingTest, PromptsOfOneTokenAndOfTheMaximumLengthComplete) {
  Reply one = Generate({"xs"}, "scd", {Prompt(0)[0]}, 8);
  ASSERT_TRUE(one.events["xs"].back().has_finished()) << one.events["xs"].back().DebugString();
  EXPECT_EQ(RanModeName(one.events["xs"].front().started()), "local");
  std::vector<TokenId> longest;
  const int64_t max = stack_->consumer("xs").model->config().max_position_embeddings;
  while (static_cast<int64_t>(longest.size()) < max) {
    for (TokenId id : Prompt(1)) {
      if (static_cast<int64_t>(longest.size()) < max) longest.push_back(id);
    }
  }
  // The server's default output length fits what room is left (none): it ends by length.
  Reply full = Generate({"xs"}, "scd", longest, 0);
  ASSERT_TRUE(full.status.ok()) << full.status.error_message();
  ASSERT_TRUE(full.events["xs"].back().has_finished()) << full.events["xs"].back().DebugString();
  EXPECT_EQ(full.events["xs"].back().finished().prompt_tokens(), static_cast<uint32_t>(max));
  EXPECT_EQ(full.events["xs"].back().finished().reason(), "length");
  // An explicit max_tokens past the room, and a prompt past the maximum, are refused as a whole
  // with OUT_OF_RANGE before any work -- without early prefill: with it the producer's pass may
  // have begun when the consumer refuses, and is cancelled (FullConsumerRefuses... above).
  testing::ServingStack::Options no_early;
  no_early.early_prefill = false;
  StartStack(no_early);
  const uint64_t before = stack_->producer_service().prefills();
  Reply no_room = Generate({"xs"}, "scd", longest, 8);
  EXPECT_EQ(no_room.status.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_THAT(no_room.status.error_message(), HasSubstr("max_tokens"));
  longest.push_back(longest.back());
  Reply over = Generate({"xs"}, "scd", longest, 8);
  EXPECT_EQ(over.status.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_TRUE(over.events["xs"].empty());
  EXPECT_EQ(stack_->producer_service().prefills(), before);
}

TEST_F(ServingTest, UnknownTargetIsNotFoundNamingTheKnownOnes) {
  Reply reply = Generate({"nope"}, "", Prompt(0), 4);
  EXPECT_EQ(reply.status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(reply.status.error_message(), HasSubstr("base-copy, fables, xs"));
}

}  // namespace
}  // namespace scd
