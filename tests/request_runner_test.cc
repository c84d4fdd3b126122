// consumer::StartTarget, a request end to end on the consumer, against independent references:
// greedy tokens equal the batch transfer path (TransferPath: whole batch, batch decoder) followed
// by GenerateTokens for the same pair and mode (hard pair, scd); raw between identical models and
// local give the consumer's own local generation; every run emits Started first and exactly one
// terminal event last; a lost producer ends in Error or, when allowed, in a local fallback with the
// same tokens as local; a 1-token prompt runs local; cancellation ends "cancelled"; a moved
// stream continued from its first k tokens (DecodeRequest.continued_ids) gives the tokens and
// text the unmoved stream gave after them, greedy and seeded, a stop string across the move
// included, and counts every token once.
#include "consumer/request_runner.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/awaited.h"
#include "base/work_queue.h"
#include "codec/code_encoder.h"
#include "codec/fingerprint.h"
#include "codec/transfer.h"
#include "consumer/continuation_check.h"
#include "model/generator.h"
#include "producer/prefill_streamer.h"
#include "proto/wire_mode.h"
#include "tests/test_util.h"
#include "tests/transport_test_util.h"
#include "transport/transfer_session.h"

namespace scd {
namespace {

using ::testing::HasSubstr;

struct Outcome {
  std::vector<v1::GenerateEvent> events;
  std::vector<TokenId> ids;
  std::string text;
  std::vector<std::string> fallbacks;  // RunContext::on_fallback's mode reasons
  size_t events_before_fallback = 0;
  const v1::GenerateEvent& last() const { return events.back(); }
};

class RequestRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    producer_ = testing::Ok(LlamaModel::Load(testing::ModelDir("stories260k"), {}));
    consumer_ = testing::Ok(LlamaModel::Load(testing::ModelDir("llama2xs-260k"), {}));
    tokenizer_ =
        testing::Ok(Tokenizer::FromFile(testing::ModelDir("stories260k") + "/tokenizer.json"));
    artifact_ = testing::SyntheticArtifact(*producer_);
    artifact_.consumer = testing::Ok(ModelIdentity::Of(*consumer_));
    prompt_ = testing::LoadGolden("stories260k").prompts[2].ids;
  }
  consumer::ConsumerModel Consumer(const LlamaModel& model) {
    return {&model, tokenizer_.get(), "target", TransferOptions(), 12, absl::Seconds(30)};
  }
  v1::GenerateRequest Request(const std::vector<TokenId>& ids) {
    v1::GenerateRequest request;
    for (TokenId id : ids) request.add_prompt_ids(id);
    request.set_max_tokens(12);
    request.set_request_id("req");
    return request;
  }
  // Greedy continuation via the batch path (mode local: the consumer's own prefill).
  std::vector<TokenId> Reference(TransferMode mode, const LlamaModel& consumer) {
    KvCache cache = consumer.NewCache(64);
    if (mode != TransferMode::kLocal) {
      const Artifact* used = ModeNeedsArtifact(mode) ? &artifact_ : nullptr;
      TransferPath path =
          testing::Ok(TransferPath::Create(mode, *producer_, consumer, used, TransferOptions()));
      const std::vector<TokenId> prefix(prompt_.begin(), prompt_.end() - 1);
      EXPECT_TRUE(path.Run(prefix, &cache, InProcessHandOff()).ok());
    }
    GenerationOptions options;
    options.max_tokens = 12;
    return testing::Ok(GenerateTokens(consumer, prompt_, &cache, options)).output_ids;
  }
  // Runs the target; for modes with codes a producer thread streams the prefix over inproc.
  // How the producer's session ends: it sends every code, or opens the session and ends it at once
  // -- given up by its own failure (Abort, as a producer whose pass failed: a lost producer to the
  // consumer) or called off by its caller (Cancel, as the coordinator's cancel reaches it).
  enum class ProducerEnd { kSends, kAborts, kCancels };
  Outcome Serve(const consumer::ConsumerModel& consumer, const v1::GenerateRequest& request,
                const consumer::TargetRoute& route, ProducerEnd producer_end = ProducerEnd::kSends,
                Cancellation* cancelled = nullptr, std::string producer_fingerprint = "") {
    if (producer_fingerprint.empty()) {
      producer_fingerprint = testing::Ok(FingerprintModel(*producer_));
    }
    testing::SessionPeers peers = testing::ConnectSessions("inproc");
    std::thread producer;
    if (route.mode != TransferMode::kLocal && request.prompt_ids_size() > 1) {
      producer = std::thread([&] {
        const TransferMode mode = route.mode;
        const Artifact* used = ModeNeedsArtifact(mode) ? &artifact_ : nullptr;
        TransferPlan plan =
            testing::Ok(TransferPlan::Make(mode, producer_->config(), used, TransferOptions()));
        CodeEncoder encoder(plan, used, TransferOptions());
        const std::vector<TokenId> prefix(prompt_.begin(), prompt_.end() - 1);
        TransferIdentity identity{"req", producer_fingerprint, "", ""};
        auto header = testing::Ok(producer::StreamHeader(
            encoder, producer_->config(), static_cast<int64_t>(prefix.size()), identity));
        auto session = testing::Ok(peers.sender->StartSession(header, absl::Seconds(30)));
        if (producer_end == ProducerEnd::kAborts) return session->Abort("producer process lost");
        if (producer_end == ProducerEnd::kCancels)
          return session->Cancel("its caller called it off");
        testing::Ok(producer::StreamPrefill(*producer_, prefix, {{&encoder, session}}));
      });
    }
    consumer::RunContext context;
    context.cancellation = cancelled;
    context.take_over = take_over_;
    context.session = [&](absl::Duration timeout) { return peers.acceptor->Accept(timeout); };
    Outcome run;
    context.on_fallback = [&](const v1::GenerateEvent& notice) {
      EXPECT_EQ(RanModeName(notice.started()), "local");
      run.fallbacks.push_back(notice.started().mode_reason());
      run.events_before_fallback = run.events.size();
    };
    // As a node runs it: its scheduler and step queue (the scheduler outlives the queue's jobs).
    consumer::ConsumerModel node = consumer;
    std::optional<consumer::DecodeScheduler> scheduler;
    scheduler.emplace(*node.model, consumer::SchedulerOptions());
    std::optional<WorkQueue> steps;
    steps.emplace(2);
    node.scheduler = &*scheduler;
    node.steps = &*steps;
    Awaited<absl::Status> ended;
    // Held by the run (its event sink) for as long as the run lives.
    auto held = std::make_shared<int>(0);
    const std::weak_ptr<int> run_alive = held;
    consumer::StartTarget(
        node, request, route, context,
        [&, held](const v1::GenerateEvent& e) {
          run.events.push_back(e);
          if (e.has_token()) {
            run.text += e.token().text();
            for (int32_t id : e.token().ids()) run.ids.push_back(id);
          }
        },
        ended.Setter());
    held.reset();
    ended.Wait().IgnoreError();
    if (producer.joinable()) producer.join();
    // Once its jobs ran and its scheduler stopped, the run is gone whichever way it ended (its
    // stream's callbacks hold it: a failure before the hand-over must let go of them).
    steps.reset();
    scheduler.reset();
    EXPECT_TRUE(run_alive.expired()) << "the run outlived its end";
    // Exactly one Started first (unless refused before it) and exactly one terminal event, last.
    int terminal = 0;
    for (const auto& e : run.events) terminal += e.has_finished() || e.has_error();
    EXPECT_EQ(terminal, 1);
    EXPECT_TRUE(run.last().has_finished() || run.last().has_error());
    for (const auto& e : run.events) EXPECT_EQ(e.target(), "target");
    return run;
  }

  std::unique_ptr<LlamaModel> producer_, consumer_;
  consumer::RunContext::TakeoverAsk take_over_;  // the run's RunContext::take_over (none: unset)
  std::unique_ptr<Tokenizer> tokenizer_;
  Artifact artifact_;
  std::vector<TokenId> prompt_;
};

TEST_F(RequestRunnerTest, LocalEqualsTheConsumersOwnGeneration) {
  Outcome run = Serve(Consumer(*consumer_), Request(prompt_), {});
  ASSERT_TRUE(run.events.front().has_started());
  EXPECT_EQ(RanModeName(run.events.front().started()), "local");
  ASSERT_TRUE(run.last().has_finished()) << run.last().DebugString();
  EXPECT_EQ(run.ids, Reference(TransferMode::kLocal, *consumer_));
  GenerationOptions options;
  options.max_tokens = 12;
  EXPECT_EQ(run.text,
            testing::Ok(GenerateTextFromIds(*consumer_, *tokenizer_, prompt_, options)).text);
  const v1::Finished& f = run.last().finished();
  EXPECT_EQ(f.reason(), "length");
  EXPECT_EQ(f.output_tokens(), 12u);
  EXPECT_EQ(f.prompt_tokens(), prompt_.size());
  EXPECT_GT(f.timings().prefill(), 0u);
  EXPECT_GE(f.timings().total(), f.timings().ttft());
}

TEST_F(RequestRunnerTest, ScdOnTheHardPairEqualsTheBatchTransferPath) {
  Outcome run = Serve(Consumer(*consumer_), Request(prompt_),
                      {TransferMode::kScd, "artifact", "stories260k", &artifact_});
  ASSERT_TRUE(run.last().has_finished()) << run.last().DebugString();
  EXPECT_EQ(run.ids, Reference(TransferMode::kScd, *consumer_));
  const v1::Finished& f = run.last().finished();
  EXPECT_EQ(RanModeName(f), "scd");
  EXPECT_GT(f.payload_bytes(), 0u);
  EXPECT_GT(f.timings().rebuild(), 0u);
  EXPECT_GT(f.timings().first_decode(), 0u);
  EXPECT_EQ(run.events.front().started().producer(), "stories260k");
}

TEST_F(RequestRunnerTest, RawBetweenIdenticalModelsEqualsLocal) {
  Outcome run = Serve(Consumer(*producer_), Request(prompt_),
                      {TransferMode::kRaw, "identical", "stories260k"});
  ASSERT_TRUE(run.last().has_finished()) << run.last().DebugString();
  EXPECT_EQ(run.ids, Reference(TransferMode::kLocal, *producer_));
  EXPECT_EQ(RanModeName(run.last().finished()), "raw");
}

TEST_F(RequestRunnerTest, LostProducerFallsBackToLocalUnlessTheRequestForbidsIt) {
  consumer::TargetRoute route{TransferMode::kScd, "artifact", "stories260k", &artifact_};
  v1::GenerateRequest forbidding = Request(prompt_);
  forbidding.set_allow_local_fallback(false);
  // With a prefix cache: a transfer that never completed leaves nothing in it.
  consumer::ConsumerPrefixCache prefix_cache(*consumer_, "consumer-fp", 64 << 20);
  consumer::ConsumerModel cached = Consumer(*consumer_);
  cached.prefix_cache = &prefix_cache;
  Outcome lost = Serve(cached, forbidding, route, ProducerEnd::kAborts);
  ASSERT_TRUE(lost.last().has_error());
  EXPECT_EQ(prefix_cache.blocks().Counters().entries, 0u);
  EXPECT_EQ(prefix_cache.blocks().Counters().misses, 1u);  // it was looked up, found nothing
  Outcome failed = Serve(Consumer(*consumer_), forbidding, route, ProducerEnd::kAborts);
  ASSERT_TRUE(failed.last().has_error());
  EXPECT_THAT(failed.last().error().message(), HasSubstr("producer process lost"));
  EXPECT_TRUE(failed.ids.empty());
  EXPECT_TRUE(failed.fallbacks.empty());

  // Unset (the default since issue 50) and true both fall back.
  v1::GenerateRequest allowing = Request(prompt_);
  allowing.set_allow_local_fallback(true);
  for (const v1::GenerateRequest& request : {Request(prompt_), allowing}) {
    SCOPED_TRACE(request.has_allow_local_fallback() ? "allowed" : "unset");
    Outcome fallback = Serve(Consumer(*consumer_), request, route, ProducerEnd::kAborts);
    ASSERT_TRUE(fallback.last().has_finished()) << fallback.last().DebugString();
    EXPECT_EQ(RanModeName(fallback.last().finished()), "local");
    EXPECT_THAT(fallback.last().finished().mode_reason(), HasSubstr("fallback"));
    EXPECT_EQ(fallback.ids, Reference(TransferMode::kLocal, *consumer_));
    // Announced once, with Finished's reason, before the fallback's prefill (only Started
    // before it): what lets the coordinator stop waiting to cancel this consumer.
    ASSERT_EQ(fallback.fallbacks.size(), 1u);
    EXPECT_EQ(fallback.fallbacks[0], fallback.last().finished().mode_reason());
    EXPECT_EQ(fallback.events_before_fallback, 1u);
  }
}

// A producer that gave its session up (Abort) is lost: another may take the transfer over, so the
// run asks for a takeover first. One whose caller called it off (Cancel: the coordinator's cancel,
// which reaches this consumer's call too) is not: asking then, the coordinator could answer "no
// takeover" before it saw its client go, and a request the client cancelled would end
// UNAVAILABLE (CI, 2026-12-04: daemons_process_test ClientCancelMidTransfer...).
TEST_F(RequestRunnerTest, AProducerThatGaveItsSessionUpIsLostOneCalledOffIsNot) {
  consumer::TargetRoute route{TransferMode::kScd, "artifact", "stories260k", &artifact_};
  v1::GenerateRequest forbidding = Request(prompt_);
  forbidding.set_allow_local_fallback(false);
  std::vector<std::string> asked;
  take_over_ = [&asked](const v1::GenerateEvent& notice,
                        Cancellation*) -> absl::StatusOr<consumer::RunContext::Takeover> {
    asked.push_back(notice.transfer_lost().reason());
    return absl::UnavailableError("no takeover: the test has no other producer");
  };
  Outcome aborted = Serve(Consumer(*consumer_), forbidding, route, ProducerEnd::kAborts);
  ASSERT_EQ(asked.size(), 1u);
  EXPECT_THAT(asked[0], HasSubstr("producer process lost"));
  ASSERT_TRUE(aborted.last().has_error());
  EXPECT_EQ(aborted.last().error().code(), static_cast<int>(absl::StatusCode::kAborted));

  asked.clear();
  Outcome called_off = Serve(Consumer(*consumer_), forbidding, route, ProducerEnd::kCancels);
  EXPECT_TRUE(asked.empty()) << asked[0];
  ASSERT_TRUE(called_off.last().has_error());
  EXPECT_EQ(called_off.last().error().code(), static_cast<int>(absl::StatusCode::kCancelled));
  EXPECT_THAT(called_off.last().error().message(), HasSubstr("its caller called it off"));
  take_over_ = nullptr;
}

TEST_F(RequestRunnerTest, CodesFromAnotherProducerThanTheArtifactsArePermissionDenied) {
  v1::GenerateRequest request = Request(prompt_);
  request.set_allow_local_fallback(false);  // else it goes on with its own prefill, saying why
  Outcome run = Serve(Consumer(*consumer_), request,
                      {TransferMode::kScd, "artifact", "stories260k", &artifact_},
                      ProducerEnd::kSends, nullptr, "0123456789abcdef-not-the-producer");
  ASSERT_TRUE(run.last().has_error()) << run.last().DebugString();
  EXPECT_EQ(run.last().error().code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(run.last().error().message(), HasSubstr("0123456789ab"));
  EXPECT_THAT(run.last().error().message(), HasSubstr("fitted for stories260k"));
}

TEST_F(RequestRunnerTest, OneTokenPromptRunsLocal) {
  Outcome run = Serve(Consumer(*consumer_), Request({prompt_[0]}),
                      {TransferMode::kScd, "artifact", "stories260k", &artifact_});
  EXPECT_EQ(RanModeName(run.events.front().started()), "local");
  EXPECT_THAT(run.events.front().started().mode_reason(), HasSubstr("1-token"));
  ASSERT_TRUE(run.last().has_finished()) << run.last().DebugString();
  EXPECT_EQ(run.last().finished().output_tokens(), 12u);
}

TEST_F(RequestRunnerTest, BadRequestsEndInOneErrorWithTheirCode) {
  v1::GenerateRequest both = Request(prompt_);
  both.set_prompt("once upon a time");
  Outcome run = Serve(Consumer(*consumer_), both, {});
  ASSERT_EQ(run.events.size(), 1u);
  EXPECT_EQ(run.last().error().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  v1::GenerateRequest outside = Request({1, 999999});
  EXPECT_EQ(Serve(Consumer(*consumer_), outside, {}).last().error().code(),
            static_cast<int>(absl::StatusCode::kInvalidArgument));
  // Values past their bounds (inference.proto) are OUT_OF_RANGE; before, top_p -1 or NaN was
  // silently "off" and max_tokens / top_k >= 2^31 wrapped negative.
  v1::GenerateRequest hot = Request(prompt_);
  hot.set_temperature(-1);
  EXPECT_EQ(Serve(Consumer(*consumer_), hot, {}).last().error().code(),
            static_cast<int>(absl::StatusCode::kOutOfRange));
  for (float top_p : {-1.0f, std::nanf(""), 5.0f}) {
    v1::GenerateRequest bad = Request(prompt_);
    bad.set_top_p(top_p);
    Outcome out = Serve(Consumer(*consumer_), bad, {});
    EXPECT_EQ(out.last().error().code(), static_cast<int>(absl::StatusCode::kOutOfRange)) << top_p;
    EXPECT_THAT(out.last().error().message(), HasSubstr("top_p")) << top_p;
  }
  v1::GenerateRequest many = Request(prompt_);
  many.set_max_tokens(1u << 31);
  EXPECT_EQ(Serve(Consumer(*consumer_), many, {}).last().error().code(),
            static_cast<int>(absl::StatusCode::kOutOfRange));
  v1::GenerateRequest wide = Request(prompt_);
  wide.set_top_k(1u << 31);
  EXPECT_EQ(Serve(Consumer(*consumer_), wide, {}).last().error().code(),
            static_cast<int>(absl::StatusCode::kOutOfRange));
}

TEST_F(RequestRunnerTest, CancelledRequestFinishesCancelled) {
  // Seen before the local prefill's first chunk: nothing is computed, no token sent.
  Cancellation cancelled;
  cancelled.Cancel(absl::CancelledError("the test cancels it before it runs"));
  Outcome run = Serve(Consumer(*consumer_), Request(prompt_), {}, ProducerEnd::kSends, &cancelled);
  ASSERT_TRUE(run.last().has_finished()) << run.last().DebugString();
  EXPECT_EQ(run.last().finished().reason(), "cancelled");
  EXPECT_EQ(run.ids.size(), 0u);
  EXPECT_EQ(run.last().finished().output_tokens(), 0u);
}

// The text of `run`'s first `k` token events (what a client had when the stream moved).
std::string TextOfFirst(const Outcome& run, size_t k) {
  std::string text;
  size_t tokens = 0;
  for (const v1::GenerateEvent& e : run.events) {
    if (!e.has_token() || e.token().ids_size() == 0) continue;
    if (tokens++ == k) break;
    text += e.token().text();
  }
  return text;
}

// A moved stream (consumer/request_runner.h ContinueStream, what Consumer.Decode does with
// continued_ids): prompt + the first k outputs prefilled, those k replayed without events.
TEST_F(RequestRunnerTest, AMovedStreamGoesOnWithTheTokensAndTextItWouldHaveGivenUnmoved) {
  const consumer::ConsumerModel node = Consumer(*consumer_);
  v1::GenerateRequest greedy = Request(prompt_);
  v1::GenerateRequest seeded = Request(prompt_);
  seeded.set_temperature(0.8f);
  seeded.set_top_p(0.9f);
  seeded.set_seed(77);
  for (const v1::GenerateRequest& request : {greedy, seeded}) {
    const Outcome unmoved = Serve(node, request, {});
    ASSERT_TRUE(unmoved.last().has_finished()) << unmoved.last().DebugString();
    ASSERT_EQ(unmoved.ids.size(), 12u) << "the model stopped early: pick another prompt";
    for (size_t k : {size_t{1}, size_t{5}, size_t{11}}) {
      SCOPED_TRACE(::testing::Message() << "temperature " << request.temperature() << ", k " << k);
      consumer::TargetRoute route;
      std::vector<TokenId> ids = prompt_;
      {
        const absl::Status ok = consumer::ContinueStream(
            node, request, absl::MakeConstSpan(unmoved.ids).first(k), &route, &ids);
        EXPECT_TRUE(ok.ok()) << ok;
      }
      EXPECT_EQ(route.continued, static_cast<int64_t>(k));
      v1::GenerateRequest continued = request;
      continued.clear_prompt_ids();
      for (TokenId id : ids) continued.add_prompt_ids(id);
      const Outcome moved = Serve(node, continued, route);
      ASSERT_TRUE(moved.last().has_finished()) << moved.last().DebugString();
      EXPECT_EQ(moved.ids, std::vector<TokenId>(unmoved.ids.begin() + k, unmoved.ids.end()));
      EXPECT_EQ(TextOfFirst(unmoved, k) + moved.text, unmoved.text);
      const v1::Finished& f = moved.last().finished();
      EXPECT_EQ(f.output_tokens(), 12u);  // every token once: k before the move, the rest here
      EXPECT_EQ(f.prompt_tokens(), prompt_.size());
      EXPECT_EQ(f.reason(), "length");
    }
  }
}

// A stream that began from codes continues from codes: the producer's codes for the prompt are
// rebuilt as before, the prompt's last token runs as the tail, and the continued ids are
// prefilled on top -- the positions the unmoved stream decoded with the consumer's own weights.
TEST_F(RequestRunnerTest, AMovedStreamFromCodesGoesOnWithTheTokensItWouldHaveGivenUnmoved) {
  const consumer::ConsumerModel node = Consumer(*consumer_);
  for (TransferMode mode : {TransferMode::kScd, TransferMode::kRaw}) {
    const consumer::TargetRoute routed{mode, "artifact", "stories260k",
                                       ModeNeedsArtifact(mode) ? &artifact_ : nullptr};
    const Outcome unmoved = Serve(node, Request(prompt_), routed);
    ASSERT_TRUE(unmoved.last().has_finished()) << unmoved.last().DebugString();
    ASSERT_EQ(RanModeName(unmoved.last().finished()), TransferModeName(mode));
    ASSERT_EQ(unmoved.ids.size(), 12u) << "the model stopped early: pick another prompt";
    for (size_t k : {size_t{1}, size_t{5}, size_t{11}}) {
      SCOPED_TRACE(::testing::Message() << TransferModeName(mode) << ", k " << k);
      consumer::TargetRoute route = routed;
      std::vector<TokenId> ids = prompt_;
      {
        const absl::Status ok = consumer::ContinueStream(
            node, Request(prompt_), absl::MakeConstSpan(unmoved.ids).first(k), &route, &ids);
        ASSERT_TRUE(ok.ok()) << ok;
      }
      v1::GenerateRequest continued = Request(prompt_);
      continued.clear_prompt_ids();
      for (TokenId id : ids) continued.add_prompt_ids(id);
      const Outcome moved = Serve(node, continued, route);
      ASSERT_TRUE(moved.last().has_finished()) << moved.last().DebugString();
      EXPECT_EQ(RanModeName(moved.last().finished()), TransferModeName(mode));
      EXPECT_EQ(moved.ids, std::vector<TokenId>(unmoved.ids.begin() + k, unmoved.ids.end()));
      EXPECT_EQ(moved.last().finished().output_tokens(), 12u);
      EXPECT_EQ(moved.last().finished().prompt_tokens(), prompt_.size());
    }
  }
}

TEST_F(RequestRunnerTest, AStopStringAcrossTheMoveEndsTheMovedStreamWhereItWouldHaveEnded) {
  const consumer::ConsumerModel node = Consumer(*consumer_);
  const Outcome plain = Serve(node, Request(prompt_), {});
  ASSERT_EQ(plain.ids.size(), 12u);
  // Tokens 4..6's text: what the stream held back at the move (after token 5) ends it at 6.
  std::vector<std::string> pieces;
  for (const v1::GenerateEvent& e : plain.events) {
    if (e.has_token() && e.token().ids_size() > 0) pieces.push_back(e.token().text());
  }
  const std::string stop = pieces[4] + pieces[5] + pieces[6];
  ASSERT_FALSE(stop.empty());
  v1::GenerateRequest request = Request(prompt_);
  request.add_stop(stop);
  const Outcome unmoved = Serve(node, request, {});
  ASSERT_TRUE(unmoved.last().has_finished());
  ASSERT_EQ(unmoved.last().finished().reason(), "stop");
  ASSERT_GT(unmoved.ids.size(), 6u) << "the stop string matched before the move";
  const size_t k = 6;  // tokens 0..5 streamed; 4 and 5's text held back as a possible stop
  consumer::TargetRoute route;
  std::vector<TokenId> ids = prompt_;
  {
    const absl::Status ok = consumer::ContinueStream(
        node, request, absl::MakeConstSpan(unmoved.ids).first(k), &route, &ids);
    EXPECT_TRUE(ok.ok()) << ok;
  }
  v1::GenerateRequest continued = request;
  continued.clear_prompt_ids();
  for (TokenId id : ids) continued.add_prompt_ids(id);
  const Outcome moved = Serve(node, continued, route);
  ASSERT_TRUE(moved.last().has_finished()) << moved.last().DebugString();
  EXPECT_EQ(moved.last().finished().reason(), "stop");
  EXPECT_EQ(moved.ids, std::vector<TokenId>(unmoved.ids.begin() + k, unmoved.ids.end()));
  EXPECT_EQ(TextOfFirst(unmoved, k) + moved.text, unmoved.text);
  EXPECT_EQ(moved.last().finished().output_tokens(), unmoved.last().finished().output_tokens());
}

TEST_F(RequestRunnerTest, ContinuedIdsAreCheckedBeforeAnyWork) {
  const consumer::ConsumerModel node = Consumer(*consumer_);
  const v1::GenerateRequest request = Request(prompt_);  // max_tokens 12
  auto check = [&](std::vector<int32_t> continued, consumer::TargetRoute route) {
    std::vector<TokenId> ids = prompt_;
    absl::Status status = consumer::ContinueStream(node, request, continued, &route, &ids);
    if (!status.ok()) {
      EXPECT_EQ(ids, prompt_) << "refused, yet changed";
    }
    return status;
  };
  EXPECT_TRUE(check({}, {}).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(check({1, -1}, {})));
  EXPECT_TRUE(absl::IsInvalidArgument(
      check({1, static_cast<int32_t>(consumer_->config().vocab_size)}, {})));
  EXPECT_TRUE(absl::IsInvalidArgument(check(std::vector<int32_t>(12, 1), {})));  // none left
  consumer::TargetRoute scd{TransferMode::kScd, "artifact", "stories260k", &artifact_};
  EXPECT_TRUE(check({1}, scd).ok());  // codes for the prompt, the continued ids prefilled
  scd.early_prefill = true;           // its codes would cover a prompt that has no such ids
  EXPECT_TRUE(absl::IsInvalidArgument(check({1}, scd)));
  v1::GenerateRequest long_one = request;
  long_one.set_max_tokens(
      static_cast<uint32_t>(consumer_->config().max_position_embeddings - prompt_.size() + 1));
  std::vector<TokenId> ids = prompt_;
  consumer::TargetRoute route;
  const std::vector<int32_t> one{1};
  EXPECT_TRUE(absl::IsOutOfRange(consumer::ContinueStream(node, long_one, one, &route, &ids)));
}

}  // namespace
}  // namespace scd
