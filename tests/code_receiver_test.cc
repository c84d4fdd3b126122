// ReceiveIntoCache's time policy on a simulated clock, over a real session (the in-process
// transport) carrying the stories260k model's raw codes: the transfer timeout starts again with
// every chunk and does not count a chunk's rebuild (held back here as the scheduler holds it), the
// request's deadline covers the whole transfer, a cancellation ends it at once and the producer
// hears each of them. Each verdict falls at the microsecond the policy names: a timer either
// fired inside Advance (the session ended there) or did not, however busy the machine. The
// receive holds no thread: its steps run as jobs on a queue the test counts.
#include "consumer/code_receiver.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "base/simulated_clock.h"
#include "base/work_queue.h"
#include "codec/code_encoder.h"
#include "proto/code_chunk_framing.h"
#include "tests/test_util.h"
#include "tests/transport_test_util.h"

namespace scd::consumer {
namespace {

using ::testing::HasSubstr;

class CodeReceiverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = testing::Ok(LlamaModel::Load(testing::ModelDir("stories260k"), {}));
    prefix_ = testing::LoadGolden("stories260k").prompts[2].ids;
    plan_ = testing::Ok(TransferPlan::Make(TransferMode::kRaw, model_->config(), nullptr, {}));
    CodeEncoder encoder(plan_, nullptr, {});
    batch_ = testing::Ok(encoder.Prefill(*model_, prefix_));
    expected_ =
        testing::Ok(encoder.PlannedChunks(model_->config(), static_cast<int64_t>(prefix_.size())));
    decoder_ = std::make_unique<CodeDecoder>(*model_, nullptr);
    cache_.emplace(model_->NewCache(64));
    peers_ = testing::ConnectSessions("inproc");
    const v1::TransferHeader header =
        FrameHeader(TransferMode::kRaw, static_cast<int64_t>(prefix_.size()),
                    model_->config().num_layers, expected_, {"req", "", "", ""});
    sender_ = testing::Ok(peers_.sender->StartSession(header, absl::Hours(1)));
    received_ = testing::Ok(peers_.acceptor->Accept(absl::Seconds(10)));
  }
  void TearDown() override {
    if (sender_ != nullptr) sender_->Cancel("test over");
  }

  // Starts the receive: the transfer timeout `stall`, the deadline `deadline` after now.
  void Start(absl::Duration stall, absl::Duration deadline, Cancellation* cancellation = nullptr) {
    ReceiveOptions options;
    options.clock = &clock_;
    options.stall_timeout = stall;
    options.deadline = clock_.Now() + deadline;
    options.cancellation = cancellation;
    options.post = [this](std::function<void()> job) {
      steps_.Run([this, job = std::move(job)] {
        job();
        absl::MutexLock lock(&mu_);
        ++jobs_;
      });
    };
    // The rebuild's pieces wait until the test runs them, as they wait for a scheduler's step.
    options.pacing.run = [this](int64_t rows, int, RebuildPacing::Piece work,
                                RebuildPacing::Done done) {
      absl::MutexLock lock(&mu_);
      held_.push_back(
          [rows, work = std::move(work), done = std::move(done)] { done(work(0, rows)); });
    };
    ReceiveIntoCache(received_, *decoder_, plan_, expected_, prefix_, &*cache_, std::move(options),
                     [this](absl::StatusOr<ReceiveReport> report) {
                       absl::MutexLock lock(&mu_);
                       result_ = std::move(report);
                     });
  }
  // Sends chunk `i` of the batch and waits until the receive's step took it.
  void Send(size_t i) {
    size_t before;
    {
      absl::MutexLock lock(&mu_);
      before = jobs_;
    }
    FramedChunk framed = FrameChunk(batch_.chunks[i]);
    ASSERT_TRUE(sender_
                    ->SendChunk(std::move(framed.meta),
                                transport::Payload(framed.data, framed.size, framed.owner))
                    .ok());
    absl::MutexLock lock(&mu_);
    auto taken = [this, before]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return jobs_ > before; };
    mu_.Await(absl::Condition(&taken));
  }
  // Runs the rebuild pieces held back so far (their `done` goes on with the receive).
  void RunHeld() {
    std::vector<std::function<void()>> held;
    {
      absl::MutexLock lock(&mu_);
      held.swap(held_);
    }
    for (auto& piece : held) piece();
  }
  size_t held() {
    absl::MutexLock lock(&mu_);
    return held_.size();
  }
  absl::StatusOr<ReceiveReport> Result() {
    absl::MutexLock lock(&mu_);
    auto told = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return result_.has_value(); };
    mu_.Await(absl::Condition(&told));
    return *result_;
  }
  bool open() const { return received_->state() == transport::SessionState::kOpen; }

  std::unique_ptr<LlamaModel> model_;
  std::vector<TokenId> prefix_;
  TransferPlan plan_;
  CodeBatch batch_;
  std::vector<PlannedChunk> expected_;
  std::unique_ptr<CodeDecoder> decoder_;
  std::optional<KvCache> cache_;
  testing::SessionPeers peers_;
  std::shared_ptr<transport::SendSession> sender_;
  std::shared_ptr<transport::ReceiveSession> received_;
  SimulatedClock clock_;
  absl::Mutex mu_;
  size_t jobs_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::function<void()>> held_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::StatusOr<ReceiveReport>> result_ ABSL_GUARDED_BY(mu_);
  WorkQueue steps_{1};  // last: its jobs finish before the fixture goes
};

TEST_F(CodeReceiverTest, TheTransferTimeoutStartsAgainWithEveryChunkAndSkipsItsRebuild) {
  const absl::Duration stall = absl::Seconds(1);
  Start(stall, absl::Hours(1));
  Send(0);  // layer 0's key: nothing to rebuild yet
  clock_.Advance(absl::Milliseconds(800));
  Send(1);  // layer 0's value: the layer's rebuild waits for its step
  ASSERT_EQ(held(), 1u);
  clock_.Advance(absl::Seconds(5));  // a long wait for the scheduler is not a stall
  EXPECT_TRUE(open());
  RunHeld();  // rebuilt now: the stall clock starts again from here
  clock_.Advance(stall - absl::Microseconds(1));
  EXPECT_TRUE(open()) << "stalled before the transfer timeout";
  clock_.Advance(absl::Microseconds(1));
  EXPECT_FALSE(open()) << "no stall at the transfer timeout";
  const absl::StatusOr<ReceiveReport> result = Result();
  EXPECT_TRUE(absl::IsDeadlineExceeded(result.status())) << result.status();
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("the transfer stalled"));
  ASSERT_TRUE(sender_->WaitForEnd(absl::Seconds(10)));
  EXPECT_THAT(std::string(sender_->status().message()), HasSubstr("the transfer stalled"));
  EXPECT_EQ(clock_.pending(), 0u) << "a timer outlived the receive";
}

TEST_F(CodeReceiverTest, TheDeadlineCoversTheWholeTransferThoughChunksKeepComing) {
  const absl::Duration deadline = absl::Milliseconds(2500);
  Start(absl::Seconds(1), deadline);
  for (size_t i = 0; i < 3; ++i) {  // every 800 ms: never a stall
    clock_.Advance(absl::Milliseconds(800));
    Send(i);
    RunHeld();
  }
  clock_.Advance(absl::Milliseconds(100) - absl::Microseconds(1));
  EXPECT_TRUE(open()) << "ended before its deadline";
  clock_.Advance(absl::Microseconds(1));
  EXPECT_FALSE(open()) << "still open at its deadline";
  const absl::StatusOr<ReceiveReport> result = Result();
  EXPECT_TRUE(absl::IsDeadlineExceeded(result.status())) << result.status();
  EXPECT_THAT(std::string(result.status().message()),
              HasSubstr("no complete transfer within 2.5s"));
}

TEST_F(CodeReceiverTest, ACancellationEndsTheSessionAtOnceAndTheProducerHearsIt) {
  Cancellation cancellation;
  Start(absl::Seconds(1), absl::Hours(1), &cancellation);
  Send(0);
  cancellation.Cancel(absl::CancelledError("the client went away"));
  EXPECT_FALSE(open());
  EXPECT_TRUE(absl::IsCancelled(Result().status()));
  ASSERT_TRUE(sender_->WaitForEnd(absl::Seconds(10)));
  EXPECT_THAT(std::string(sender_->status().message()), HasSubstr("cancelled by the caller"));
  EXPECT_EQ(clock_.pending(), 0u);
}

TEST_F(CodeReceiverTest, EveryChunkRebuiltCompletesWithNoTimerLeft) {
  Start(absl::Seconds(1), absl::Hours(1));
  for (size_t i = 0; i < batch_.chunks.size(); ++i) {
    Send(i);
    RunHeld();
  }
  ASSERT_TRUE(sender_->Finish().ok()) << sender_->status();
  const absl::StatusOr<ReceiveReport> report = Result();
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->chunks, static_cast<int64_t>(expected_.size()));
  EXPECT_EQ(report->bytes, TotalBytes(expected_));
  for (int l = 0; l < model_->config().num_layers; ++l) {
    EXPECT_EQ(cache_->length(l), static_cast<int64_t>(prefix_.size())) << "layer " << l;
  }
  EXPECT_EQ(clock_.pending(), 0u);
}

}  // namespace
}  // namespace scd::consumer
