// consumer::DecodeScheduler, continuous batching on real checkpoints, against GenerateTokens of
// each sequence alone: greedy sequences submitted at different times (joining a running batch,
// leaving it at their own max_tokens or stop) give the tokens they give alone; a seeded sampled
// sequence gives the same tokens alone and beside others; steps really batch (several sequences
// per step); cancellation and deadlines end a sequence between steps, during its prefill too,
// while the others go on; rebuild work handed in from another thread runs in order, in pieces
// covering every row once, between steps; a long prefill beside running decodes is chunked so
// they keep producing tokens; every sequence ends exactly once, UNAVAILABLE when the scheduler is
// destroyed; a sequence's prompt logits from a position reach its sink chunk by chunk. Greedy
// comparisons on the real models: see forward_batch_test.cc for the bound on
// logits batched against alone; the prompts here are golden prompts without near-ties there.
#include "consumer/decode_scheduler.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/awaited.h"
#include "base/simulated_clock.h"
#include "model/generator.h"
#include "tests/test_util.h"

namespace scd::consumer {
namespace {

// Records what the scheduler tells a sequence (scheduler thread) for the test's thread.
class RecordingSink : public SequenceSink {
 public:
  void PromptDone(const KvCache& cache) override {
    absl::MutexLock lock(&mu_);
    prompt_done_at_ = cache.length();
  }
  bool Token(TokenId id, const TokenLogprobs&) override {
    size_t count;
    bool go_on;
    {
      absl::MutexLock lock(&mu_);
      tokens_.push_back(id);
      times_.push_back(absl::Now());
      count = tokens_.size();
      go_on = stop_after_ == 0 || static_cast<int>(count) < stop_after_;
    }
    if (on_token_) on_token_(count);
    return go_on;
  }
  // Runs `hook` with the count after each token, on the scheduler's thread (between the step
  // that made the token and the next one's plan).
  void OnToken(std::function<void(size_t)> hook) { on_token_ = std::move(hook); }
  void Ended(const SequenceEnd& end) override {
    absl::MutexLock lock(&mu_);
    ++ended_;
    end_ = end;
  }
  SequenceEnd Wait() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](int* n) { return *n > 0; }, &ended_));
    return end_;
  }
  std::vector<TokenId> tokens() const {
    absl::MutexLock lock(&mu_);
    return tokens_;
  }
  // Blocks until the sequence has `n` tokens or ended (an event: Token takes the lock).
  void AwaitTokens(size_t n) const {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return tokens_.size() >= n || ended_ > 0;
    };
    mu_.Await(absl::Condition(&enough));
  }
  std::vector<absl::Time> times() const {
    absl::MutexLock lock(&mu_);
    return times_;
  }
  int ended() const {
    absl::MutexLock lock(&mu_);
    return ended_;
  }
  int64_t prompt_done_at() const {
    absl::MutexLock lock(&mu_);
    return prompt_done_at_;
  }
  void StopAfter(int n) { stop_after_ = n; }

 private:
  mutable absl::Mutex mu_;
  std::vector<TokenId> tokens_;
  std::vector<absl::Time> times_;
  int ended_ = 0;
  int64_t prompt_done_at_ = -1;
  SequenceEnd end_;
  int stop_after_ = 0;
  std::function<void(size_t)> on_token_;
};

std::vector<TokenId> Prompt(const std::string& model, int index, size_t length) {
  return testing::GoldenContinuation(model, index, length);
}

// RunBetweenSteps, waited for.
absl::Status RunWaited(DecodeScheduler& scheduler, int64_t rows, int layers,
                       RebuildPacing::Piece work) {
  Awaited<absl::Status> done;
  scheduler.RunBetweenSteps(rows, layers, std::move(work), done.Setter());
  return done.Wait();
}

GenerationOptions Options(int max_tokens) {
  GenerationOptions options;
  options.max_tokens = max_tokens;
  options.ignore_eos = true;
  return options;
}

class DecodeSchedulerTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    model_ = testing::Ok(LlamaModel::Load(testing::ModelDir(GetParam()), {}));
  }
  std::vector<TokenId> Alone(const std::vector<TokenId>& prompt, const GenerationOptions& options) {
    KvCache cache = model_->NewCache(static_cast<int64_t>(prompt.size()) + options.max_tokens);
    return testing::Ok(GenerateTokens(*model_, prompt, &cache, options)).output_ids;
  }
  SequenceRequest Request(const std::vector<TokenId>& prompt, const GenerationOptions& options,
                          SequenceSink* sink, int64_t cached = 0) {
    KvCache cache = model_->NewCache(static_cast<int64_t>(prompt.size()) + options.max_tokens);
    if (cached > 0) {
      testing::Ok(model_->Forward(absl::MakeConstSpan(prompt).first(cached), &cache,
                                  {.logits = LogitsMode::kNone}));
    }
    return SequenceRequest{
        prompt, std::move(cache), at::Tensor(), options, absl::InfiniteFuture(), nullptr, sink};
  }
  // Submits a sequence that decodes to the model's last position unless `stop` is set, and waits
  // for its 20th token.
  void SubmitDecoding(DecodeScheduler& scheduler, RecordingSink* sink, std::atomic<bool>* stop) {
    SequenceRequest request = Request(Prompt(GetParam(), 0, 8), Options(100000), sink);
    request.options.max_tokens = static_cast<int>(model_->config().max_position_embeddings) - 8;
    request.cancelled = stop;
    ASSERT_TRUE(scheduler.Submit(std::move(request)).ok());
    sink->AwaitTokens(20);
  }
  std::unique_ptr<LlamaModel> model_;
};

TEST_P(DecodeSchedulerTest, SequencesJoiningAndLeavingGiveTheirTokensAlone) {
  SchedulerOptions options;
  options.max_batched_tokens = 24;  // the longer prompts prefill in chunks beside the decodes
  DecodeScheduler scheduler(*model_, options);
  struct Case {
    std::vector<TokenId> prompt;
    int max_tokens;
    size_t join;  // once the first sequence has this many tokens
  };
  const std::vector<Case> cases = {
      {Prompt(GetParam(), 0, 10), 40, 0},
      {Prompt(GetParam(), 1, 30), 12, 0},
      {Prompt(GetParam(), 2, 45), 30, 3},
      {Prompt(GetParam(), 3, 7), 25, 8},
      {Prompt(GetParam(), 0, 52), 8, 12},
  };
  std::vector<std::unique_ptr<RecordingSink>> sinks;
  for (const Case& c : cases) {
    if (!sinks.empty()) sinks.front()->AwaitTokens(c.join);
    sinks.push_back(std::make_unique<RecordingSink>());
    ASSERT_TRUE(
        scheduler.Submit(Request(c.prompt, Options(c.max_tokens), sinks.back().get())).ok());
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    const SequenceEnd end = sinks[i]->Wait();
    EXPECT_TRUE(end.status.ok()) << end.status;
    EXPECT_EQ(FinishReasonName(end.finish_reason), "length");
    EXPECT_EQ(sinks[i]->tokens(), Alone(cases[i].prompt, Options(cases[i].max_tokens))) << i;
    EXPECT_EQ(sinks[i]->prompt_done_at(), static_cast<int64_t>(cases[i].prompt.size())) << i;
    EXPECT_EQ(sinks[i]->ended(), 1);
  }
  const DecodeScheduler::Stats stats = scheduler.stats();
  EXPECT_GE(stats.max_batch, 3) << "the steps did not batch";
  EXPECT_EQ(stats.running, 0);
}

// Whoever is told a sequence ended sees stats that no longer count it: the scheduler publishes
// before it tells the sinks (the test above read running 1 after every sink had ended, now and
// then, under another BLAS kernel's timing). Each sink reads the stats inside Ended.
TEST_P(DecodeSchedulerTest, ASinkToldOfItsEndSeesStatsWithoutIt) {
  class StatsReadingSink : public RecordingSink {
   public:
    explicit StatsReadingSink(const DecodeScheduler* scheduler) : scheduler_(scheduler) {}
    void Ended(const SequenceEnd& end) override {
      running_at_end = scheduler_->stats().running;
      RecordingSink::Ended(end);
    }
    std::atomic<int64_t> running_at_end{-1};

   private:
    const DecodeScheduler* scheduler_;
  };
  DecodeScheduler scheduler(*model_, SchedulerOptions());
  std::vector<std::unique_ptr<StatsReadingSink>> sinks;
  std::atomic<bool> cancelled{false};
  // 400 tokens (it outlives the rest by far); 500, cancelled once the third ended; 4, submitted
  // last so that the other two have joined when it ends.
  const int max_tokens[] = {400, 500, 4};
  for (int i = 0; i < 3; ++i) {
    sinks.push_back(std::make_unique<StatsReadingSink>(&scheduler));
    SequenceRequest request =
        Request(Prompt(GetParam(), i, 6), Options(max_tokens[i]), sinks.back().get());
    if (i == 1) request.cancelled = &cancelled;  // ends at a step's start, not by its tokens
    ASSERT_TRUE(scheduler.Submit(std::move(request)).ok());
  }
  sinks[2]->Wait();
  EXPECT_EQ(sinks[2]->running_at_end.load(), 2);
  cancelled = true;
  sinks[1]->Wait();
  EXPECT_EQ(sinks[1]->running_at_end.load(), 1);
  sinks[0]->Wait();
  EXPECT_EQ(sinks[0]->running_at_end.load(), 0);
  EXPECT_EQ(scheduler.stats().running, 0);
}

TEST_P(DecodeSchedulerTest, ASeededSampledSequenceGivesItsTokensWhateverElseRuns) {
  GenerationOptions sampled = Options(30);
  sampled.sampling.temperature = 0.9f;
  sampled.sampling.top_p = 0.95f;
  sampled.sampling.seed = 1234;
  const std::vector<TokenId> prompt = Prompt(GetParam(), 1, 12);
  DecodeScheduler scheduler(*model_, SchedulerOptions());
  RecordingSink alone;
  ASSERT_TRUE(scheduler.Submit(Request(prompt, sampled, &alone)).ok());
  alone.Wait();
  // Again beside three greedy and one other sampled sequence, submitted first.
  std::vector<std::unique_ptr<RecordingSink>> others;
  for (int i = 0; i < 4; ++i) {
    others.push_back(std::make_unique<RecordingSink>());
    GenerationOptions o = Options(40);
    if (i == 3) {
      o.sampling.temperature = 1.0f;
      o.sampling.seed = 99;
    }
    ASSERT_TRUE(
        scheduler.Submit(Request(Prompt(GetParam(), i, 9 + 5 * i), o, others.back().get())).ok());
  }
  RecordingSink batched;
  ASSERT_TRUE(scheduler.Submit(Request(prompt, sampled, &batched)).ok());
  batched.Wait();
  for (auto& sink : others) sink->Wait();
  EXPECT_EQ(batched.tokens(), alone.tokens());
  EXPECT_EQ(alone.tokens(), Alone(prompt, sampled));
  EXPECT_GE(scheduler.stats().max_batch, 2);
}

// On a simulated clock: the cancel and the clock's move past the deadline happen inside a token's
// callback, so each sequence must leave at the very next step, with exactly the tokens it had.
TEST_P(DecodeSchedulerTest, CancelAndDeadlineEndASequenceBetweenStepsOthersGoOn) {
  SimulatedClock clock;
  SchedulerOptions options;
  options.clock = &clock;
  DecodeScheduler scheduler(*model_, options);
  std::atomic<bool> cancel{false};
  RecordingSink cancelled, expired, kept;
  const std::vector<TokenId> prompt = Prompt(GetParam(), 2, 20);
  SequenceRequest a = Request(prompt, Options(200), &cancelled);
  a.cancelled = &cancel;
  cancelled.OnToken([&](size_t n) {
    if (n == 3) cancel = true;
  });
  SequenceRequest b = Request(prompt, Options(200), &expired);
  b.deadline = clock.Now() + absl::Milliseconds(30);
  expired.OnToken([&](size_t n) {
    if (n == 5) clock.Advance(absl::Milliseconds(30));  // at the deadline: still runs
    if (n == 6) clock.Advance(absl::Microseconds(1));   // past it
  });
  ASSERT_TRUE(scheduler.Submit(std::move(a)).ok());
  ASSERT_TRUE(scheduler.Submit(std::move(b)).ok());
  ASSERT_TRUE(scheduler.Submit(Request(prompt, Options(60), &kept)).ok());
  const SequenceEnd c = cancelled.Wait();
  EXPECT_TRUE(absl::IsCancelled(c.status)) << c.status;
  EXPECT_EQ(FinishReasonName(c.finish_reason), "cancelled");
  EXPECT_EQ(cancelled.tokens().size(), 3u);
  const SequenceEnd e = expired.Wait();
  EXPECT_TRUE(absl::IsDeadlineExceeded(e.status)) << e.status;
  EXPECT_EQ(expired.tokens().size(), 6u);
  const SequenceEnd k = kept.Wait();
  EXPECT_TRUE(k.status.ok());
  EXPECT_EQ(kept.tokens(), Alone(prompt, Options(60)));
}

// A sequence that joins with its first logits (a rebuilt cache) in the step where another leaves
// gets its first token before that step's forward -- the decoding sequence's token of that step
// comes after it -- and the leaving one, freed before the batch runs, is not touched (found by
// cancel_storm_test: the first-logits pass read the step's members after the leaves were freed).
TEST_P(DecodeSchedulerTest, AJoinWithFirstLogitsBesideALeaveGetsItsTokenBeforeTheForward) {
  DecodeScheduler scheduler(*model_, SchedulerOptions());
  const std::vector<TokenId> prompt = Prompt(GetParam(), 2, 20);
  KvCache cache = model_->NewCache(static_cast<int64_t>(prompt.size()) + 16);
  ForwardOutput out = testing::Ok(model_->Forward(prompt, &cache, {.logits = LogitsMode::kLast}));
  SequenceRequest join{
      prompt,      std::move(cache),       out.logits.to(at::kFloat).reshape({1, -1}),
      Options(16), absl::InfiniteFuture(), nullptr,
      nullptr};
  std::atomic<bool> cancel{false};
  RecordingSink leaving, joining, decoding;
  join.sink = &joining;
  size_t decoded_at_leave = 0, decoded_at_join = 0;
  leaving.OnToken([&](size_t n) {  // on the scheduler's thread, in the step's picks
    if (n != 3) return;
    cancel = true;  // leaves in the next step, which `join` joins
    decoded_at_leave = decoding.tokens().size();
    EXPECT_TRUE(scheduler.Submit(std::move(join)).ok());
  });
  joining.OnToken([&](size_t n) {
    if (n == 1) decoded_at_join = decoding.tokens().size();
  });
  // The decoding one first (decoding by the time the others come: picked first in each step).
  ASSERT_TRUE(scheduler.Submit(Request(prompt, Options(60), &decoding)).ok());
  decoding.AwaitTokens(2);
  SequenceRequest a = Request(prompt, Options(200), &leaving);
  a.cancelled = &cancel;
  ASSERT_TRUE(scheduler.Submit(std::move(a)).ok());
  EXPECT_TRUE(absl::IsCancelled(leaving.Wait().status));
  EXPECT_TRUE(joining.Wait().status.ok());
  EXPECT_EQ(joining.tokens(), Alone(prompt, Options(16)));
  EXPECT_TRUE(decoding.Wait().status.ok());
  EXPECT_EQ(decoding.tokens(), Alone(prompt, Options(60)));
  // The decoding one is picked first in each step: its token of the leave's step came before the
  // leave's hook, and the join's first token before its token of the next step.
  EXPECT_GT(decoded_at_leave, 0u);
  EXPECT_EQ(decoded_at_join, decoded_at_leave);
}

TEST_P(DecodeSchedulerTest, ACancelTakesEffectDuringAChunkedPrefill) {
  SchedulerOptions options;
  options.max_batched_tokens = 4;  // a 60-token prompt takes 15 steps
  DecodeScheduler scheduler(*model_, options);
  std::atomic<bool> cancel{false};
  RecordingSink sink;
  SequenceRequest request = Request(Prompt(GetParam(), 0, 56), Options(10), &sink);
  request.cancelled = &cancel;
  cancel = true;  // before its first chunk: it never reaches its first token
  ASSERT_TRUE(scheduler.Submit(std::move(request)).ok());
  const SequenceEnd end = sink.Wait();
  EXPECT_TRUE(absl::IsCancelled(end.status));
  EXPECT_TRUE(sink.tokens().empty());
  EXPECT_EQ(sink.prompt_done_at(), -1);
}

TEST_P(DecodeSchedulerTest, AStopFromTheSinkEndsTheSequenceWithStop) {
  DecodeScheduler scheduler(*model_, SchedulerOptions());
  RecordingSink sink;
  sink.StopAfter(4);
  ASSERT_TRUE(scheduler.Submit(Request(Prompt(GetParam(), 1, 10), Options(50), &sink)).ok());
  const SequenceEnd end = sink.Wait();
  EXPECT_TRUE(end.status.ok());
  EXPECT_EQ(FinishReasonName(end.finish_reason), "stop");
  EXPECT_EQ(sink.tokens().size(), 4u);
}

// A prefix already in the cache (a prefix-cache hit) is not run again: only the rest is.
TEST_P(DecodeSchedulerTest, ACachedPrefixIsContinued) {
  DecodeScheduler scheduler(*model_, SchedulerOptions());
  const std::vector<TokenId> prompt = Prompt(GetParam(), 3, 30);
  RecordingSink sink;
  ASSERT_TRUE(scheduler.Submit(Request(prompt, Options(16), &sink, /*cached=*/17)).ok());
  EXPECT_TRUE(sink.Wait().status.ok());
  EXPECT_EQ(sink.tokens(), Alone(prompt, Options(16)));
}

// Records the prompt logits a sequence asked for (SequenceRequest::prompt_logits_from); fails
// the call numbered `fail_at` (0: none) with INVALID_ARGUMENT.
class LogitsSink : public RecordingSink {
 public:
  absl::Status PromptLogits(int64_t first, const at::Tensor& logits) override {
    EXPECT_EQ(first, next_) << "contiguous, each position once";
    next_ = first + logits.size(0);
    rows_.push_back(logits.clone());
    if (static_cast<int>(rows_.size()) == fail_at_) return absl::InvalidArgumentError("judged");
    return absl::OkStatus();
  }
  void FailAt(int call) { fail_at_ = call; }
  void ExpectFrom(int64_t position) { next_ = position; }
  at::Tensor rows() const { return at::cat(rows_, 0); }  // after the sequence ended
  size_t calls() const { return rows_.size(); }

 private:
  int64_t next_ = 0;
  int fail_at_ = 0;
  std::vector<at::Tensor> rows_;
};

// A sequence asking for its prompt logits from position 12 of 30 (chunks of at most 8 rows; 5
// prompt positions from the prefix cache): its sink gets every position from 12 to the last once,
// chunk by chunk, each row the all-at-once forward's up to the near-tie bound, and the sequence
// the tokens it gives alone. A sink that refuses ends its sequence with its status, before any
// token. A position the prefill does not run is refused at Submit.
TEST_P(DecodeSchedulerTest, PromptLogitsFromAPositionReachTheSinkChunkByChunk) {
  SchedulerOptions options;
  options.max_batched_tokens = 8;
  DecodeScheduler scheduler(*model_, options);
  const std::vector<TokenId> prompt = Prompt(GetParam(), 1, 30);
  KvCache whole = model_->NewCache(30);
  const at::Tensor reference =
      testing::Ok(model_->Forward(prompt, &whole, {.logits = LogitsMode::kAll})).logits;

  LogitsSink sink;
  sink.ExpectFrom(12);
  SequenceRequest request = Request(prompt, Options(8), &sink, /*cached=*/5);
  request.prompt_logits_from = 12;
  ASSERT_TRUE(scheduler.Submit(std::move(request)).ok());
  ASSERT_TRUE(sink.Wait().status.ok());
  EXPECT_EQ(sink.tokens(), Alone(prompt, Options(8)));
  EXPECT_GE(sink.calls(), 3u) << "18 positions in chunks of at most 8";
  const at::Tensor rows = sink.rows();
  ASSERT_EQ(rows.size(0), 18);
  EXPECT_LE((rows - reference.narrow(0, 12, 18)).abs().max().item<double>(),
            model_->NearTieBound());

  LogitsSink refusing;
  refusing.ExpectFrom(12);
  refusing.FailAt(2);
  request = Request(prompt, Options(8), &refusing, /*cached=*/5);
  request.prompt_logits_from = 12;
  ASSERT_TRUE(scheduler.Submit(std::move(request)).ok());
  const SequenceEnd end = refusing.Wait();
  EXPECT_EQ(end.status.code(), absl::StatusCode::kInvalidArgument) << end.status;
  EXPECT_EQ(refusing.calls(), 2u);
  EXPECT_TRUE(refusing.tokens().empty());

  for (int64_t from : {4, 30}) {  // in the cache already; past the prompt
    request = Request(prompt, Options(8), &sink, /*cached=*/5);
    request.prompt_logits_from = from;
    EXPECT_EQ(scheduler.Submit(std::move(request)).code(), absl::StatusCode::kInvalidArgument)
        << from;
  }
}

TEST_P(DecodeSchedulerTest, RebuildWorkRunsInOrderInPiecesCoveringEveryRow) {
  DecodeScheduler scheduler(*model_, SchedulerOptions());
  RecordingSink decoding;
  ASSERT_TRUE(scheduler.Submit(Request(Prompt(GetParam(), 0, 12), Options(120), &decoding)).ok());
  std::mutex mu;
  std::vector<std::pair<int, std::pair<int64_t, int64_t>>> pieces;  // (work, (begin, count))
  std::vector<int> done_order;
  std::vector<Awaited<absl::Status>> done(3);
  for (int w = 0; w < 3; ++w) {  // handed in at once, no thread waiting: each work's rows in order
    // Rows x layers beyond one step's budget (512 rows of every layer): split for sure.
    scheduler.RunBetweenSteps(
        1500, static_cast<int>(model_->config().num_layers),
        [&, w](int64_t begin, int64_t count) -> absl::Status {
          // Some real work, so the pacing measures something.
          at::Tensor x = at::randn({count, 64});
          (void)x.matmul(x.t()).sum();
          std::lock_guard<std::mutex> lock(mu);
          pieces.push_back({w, {begin, count}});
          return absl::OkStatus();
        },
        [&, w, told = done[w].Setter()](absl::Status status) {
          {
            std::lock_guard<std::mutex> lock(mu);
            done_order.push_back(w);
          }
          told(std::move(status));
        });
  }
  for (auto& d : done) EXPECT_TRUE(d.Wait().ok());
  EXPECT_EQ(done_order, (std::vector<int>{0, 1, 2})) << "work handed in earlier ends first";
  std::map<int, int64_t> next;
  for (const auto& [w, range] : pieces) {
    EXPECT_EQ(range.first, next[w]) << "work " << w << " out of order";
    EXPECT_GT(range.second, 0);
    next[w] = range.first + range.second;
  }
  for (int w = 0; w < 3; ++w) EXPECT_EQ(next[w], 1500) << w;
  EXPECT_GE(pieces.size(), 9u) << "the rows were not split between steps";
  // An error stops the work at once and comes back.
  int calls = 0;
  const absl::Status failed = RunWaited(scheduler, 100, 1, [&](int64_t, int64_t) -> absl::Status {
    ++calls;
    return absl::DataLossError("bad chunk");
  });
  EXPECT_TRUE(absl::IsDataLoss(failed));
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(decoding.Wait().status.ok());
}

// While sequences decode, a long prompt arrives: it is prefilled in chunks between their steps,
// so they keep producing tokens during its prefill instead of waiting for all of it. The chunks'
// size is the pacer's, learnt on the wall clock (step_pacer_test checks it on given costs): a
// decode step measured while the machine stalled would let a chunk take the whole prompt. Steps
// of at most 100 rows hold the prompt to 4 chunks or more whatever the pacer learnt: the decodes
// must still step between them.
TEST_P(DecodeSchedulerTest, ALongPrefillDoesNotFreezeRunningDecodes) {
  SchedulerOptions options;
  options.max_batched_tokens = 100;
  DecodeScheduler scheduler(*model_, options);
  std::vector<std::unique_ptr<RecordingSink>> decoders;
  std::atomic<bool> enough{false};  // the decoders stop once the prompt's first token is out
  for (int i = 0; i < 3; ++i) {
    decoders.push_back(std::make_unique<RecordingSink>());
    SequenceRequest request =
        Request(Prompt(GetParam(), i, 8), Options(400), decoders.back().get());
    request.cancelled = &enough;
    ASSERT_TRUE(scheduler.Submit(std::move(request)).ok());
  }
  decoders[0]->AwaitTokens(20);
  std::vector<TokenId> long_prompt;
  while (long_prompt.size() < 400) {
    for (TokenId id : Prompt(GetParam(), 1, 60)) long_prompt.push_back(id);
  }
  long_prompt.resize(std::min<size_t>(400, model_->config().max_position_embeddings - 8));
  RecordingSink arriving;
  const absl::Time submitted = absl::Now();
  ASSERT_TRUE(scheduler.Submit(Request(long_prompt, Options(4), &arriving)).ok());
  EXPECT_TRUE(arriving.Wait().status.ok());
  const absl::Time first = arriving.times().front();
  int during = 0;
  for (absl::Time t : decoders[0]->times()) during += t > submitted && t < first;
  EXPECT_GE(during, 3) << "the decodes stalled while the prompt prefilled";
  enough = true;
  for (auto& d : decoders) {
    const SequenceEnd end = d->Wait();
    EXPECT_TRUE(end.status.ok() || absl::IsCancelled(end.status)) << end.status;
  }
}

// The ITL cost of prompt work beside decodes, per prompt token (what auto weighs, NodeSpeeds
// local_itl / rebuild_itl). A rebuild piece's whole time over the tokens it rebuilt, on a
// simulated clock that each piece moves by 30 us a row: exactly 30 us a token, however busy the
// machine (on the wall clock, a 30 us sleep under two CPU hogs took 11x as long). A local
// prefill's pace against its wall time, and what its chunks add at most that pace (relative
// measures: both sides see the same load).
TEST_P(DecodeSchedulerTest, PromptWorkBesideDecodesReportsItsItlCostPerToken) {
  const int layers = static_cast<int>(model_->config().num_layers);
  {
    SimulatedClock clock;
    SchedulerOptions on_clock;
    on_clock.clock = &clock;
    DecodeScheduler scheduler(*model_, on_clock);
    EXPECT_EQ(scheduler.stats().rebuild_itl_us_per_token, 0);
    std::atomic<bool> enough{false};
    RecordingSink decoding;
    SubmitDecoding(scheduler, &decoding, &enough);
    // 600 rows of every layer at 30 us a row.
    ASSERT_TRUE(RunWaited(scheduler, 600, layers, [&](int64_t, int64_t count) -> absl::Status {
                  clock.Advance(absl::Microseconds(30 * count));
                  return absl::OkStatus();
                }).ok());
    ASSERT_EQ(decoding.ended(), 0) << "the decode ended before the rebuild: nothing measured";
    EXPECT_NEAR(scheduler.stats().rebuild_itl_us_per_token, 30, 1e-6);
    enough = true;
    EXPECT_TRUE(absl::IsCancelled(decoding.Wait().status));
  }
  DecodeScheduler scheduler(*model_, SchedulerOptions());
  EXPECT_EQ(scheduler.stats().local_itl_us_per_token, 0);
  std::atomic<bool> enough{false};
  RecordingSink decoding;
  SubmitDecoding(scheduler, &decoding, &enough);

  // A 300-token prompt prefilled in chunks beside the decode.
  std::vector<TokenId> long_prompt;
  while (long_prompt.size() < 300) {
    for (TokenId id : Prompt(GetParam(), 1, 60)) long_prompt.push_back(id);
  }
  long_prompt.resize(300);
  RecordingSink arriving;
  const absl::Time submitted = absl::Now();
  ASSERT_TRUE(scheduler.Submit(Request(long_prompt, Options(1), &arriving)).ok());
  ASSERT_TRUE(arriving.Wait().status.ok());
  const absl::Time first = arriving.times().front();
  ASSERT_EQ(decoding.ended(), 0);
  // The prefill's own pace beside the decode against its wall time per token: its chunk steps lie
  // within that wall time, so their pace is about it or faster (4x: the pace weighs later steps
  // more, 0.95 a step, and the last step ends after its token is given). How much faster depends
  // on what else held the CPU between them -- a stall between two chunks counts in the wall time
  // only (one of 3x the prefill's own time reads below a quarter) -- so below, only that a pace
  // was measured is checked.
  const double wall = absl::ToDoubleMicroseconds(first - submitted) / 300;
  const double busy = scheduler.stats().busy_prefill_us_per_token;
  EXPECT_GT(busy, 0);
  EXPECT_LE(busy, wall * 4);
  // What the chunks added to the decode's steps: never more than those steps' whole time. How
  // much they added is the pacer's arithmetic, checked on given costs (step_pacer_test): on the
  // wall clock it is not even sure to be above 0 -- it is each step's time past the decodes'
  // last measure alone, and a measure taken while another process held the CPU reads every
  // chunk step of this short prefill as free (CI, Sandybridge kernels under ctest -j2: 0). Its
  // size against the decode's token gaps is not checked either, for the same reason (a 4x bound
  // failed under ctest -j2, 41 against a gap reference of 200 us per token).
  const double local = scheduler.stats().local_itl_us_per_token;
  EXPECT_LE(local, busy) << "a step carrying chunks costs at least what it adds";
  enough = true;
  EXPECT_TRUE(absl::IsCancelled(decoding.Wait().status));
}

TEST_P(DecodeSchedulerTest, DestroyingTheSchedulerEndsEverySequenceOnce) {
  std::vector<std::unique_ptr<RecordingSink>> sinks;
  {
    DecodeScheduler scheduler(*model_, SchedulerOptions());
    for (int i = 0; i < 4; ++i) {
      sinks.push_back(std::make_unique<RecordingSink>());
      ASSERT_TRUE(
          scheduler.Submit(Request(Prompt(GetParam(), i, 8), Options(150), sinks.back().get()))
              .ok());
    }
  }
  for (auto& sink : sinks) {
    EXPECT_EQ(sink->ended(), 1);
    const SequenceEnd end = sink->Wait();
    EXPECT_TRUE(end.status.ok() || absl::IsUnavailable(end.status)) << end.status;
  }
}

TEST_P(DecodeSchedulerTest, BadSequencesAreRefusedAtSubmit) {
  DecodeScheduler scheduler(*model_, SchedulerOptions());
  RecordingSink sink;
  const std::vector<TokenId> prompt = Prompt(GetParam(), 0, 6);
  EXPECT_EQ(scheduler.Submit(Request(prompt, Options(4), nullptr)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(scheduler.Submit(Request({}, Options(4), &sink)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(scheduler.Submit(Request(prompt, Options(4), &sink, /*cached=*/6)).code(),
            absl::StatusCode::kInvalidArgument);  // nothing left to run, no logits given
  GenerationOptions bad = Options(4);
  bad.sampling.top_p = 0;
  EXPECT_EQ(scheduler.Submit(Request(prompt, bad, &sink)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sink.ended(), 0);
}

// The niceness of each of this process's threads, by thread id (/proc/self/task/TID/stat,
// field 19; the command name before it may hold spaces, so fields count from its ')').
std::map<int, int> ThreadNiceness() {
  std::map<int, int> out;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream in(entry.path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream fields(stat.substr(close + 2));  // from field 3 (the state)
    std::string field;
    for (int i = 3; i < 19 && fields >> field; ++i) {
    }
    int nice = 0;
    if (fields >> nice) out[std::stoi(entry.path().filename().string())] = nice;
  }
  return out;
}

// The loop's thread, and only it, runs `nice` steps nicer than the process (options.nice), so
// the threads answering the network preempt it; 0 leaves every thread as it was.
TEST_P(DecodeSchedulerTest, TheLoopsThreadRunsNicerThanTheProcess) {
  const int process_nice = ThreadNiceness().at(static_cast<int>(::getpid()));
  if (process_nice > 19 - 7) GTEST_SKIP() << "the process already runs at nice " << process_nice;
  auto nicer = [&](int by) {
    int n = 0;
    for (const auto& [tid, nice] : ThreadNiceness()) n += nice == process_nice + by ? 1 : 0;
    return n;
  };
  const int before = nicer(7);
  {
    SchedulerOptions options;
    options.nice = 7;
    DecodeScheduler scheduler(*model_, options);
    // It still runs sequences to their end; once one ended, the loop has lowered its priority
    // (the first thing it does).
    RecordingSink sink;
    ASSERT_TRUE(scheduler.Submit(Request(Prompt(GetParam(), 0, 6), Options(4), &sink)).ok());
    EXPECT_TRUE(sink.Wait().status.ok());
    EXPECT_EQ(nicer(7), before + 1);
  }
  EXPECT_EQ(nicer(7), before);  // the thread is gone with the scheduler
  SchedulerOptions same;
  same.nice = 0;
  const std::map<int, int> threads_before = ThreadNiceness();
  DecodeScheduler scheduler(*model_, same);
  RecordingSink sink;  // a sequence run to its end: the loop is past where it would renice
  ASSERT_TRUE(scheduler.Submit(Request(Prompt(GetParam(), 0, 6), Options(4), &sink)).ok());
  EXPECT_TRUE(sink.Wait().status.ok());
  for (const auto& [tid, nice] : ThreadNiceness()) {
    if (threads_before.count(tid) == 0) {
      EXPECT_EQ(nice, process_nice) << "thread " << tid;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(RealCheckpoints, DecodeSchedulerTest,
                         ::testing::Values("stories260k", "tinystories-4m"));

}  // namespace
}  // namespace scd::consumer
