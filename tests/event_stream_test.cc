// serving/event_stream.h over a real gRPC server on loopback: every event arrives once and in
// order however slowly the client reads; Push says "full" at the capacity and OnRoom follows once
// the client drained it; a client that cancels reaches the stream's cancellation (gRPC's
// OnCancel; the body never ends the call by itself), and `ended` then reports CANCELLED; a
// refused stream ends with its status and no event.
#include "serving/event_stream.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "proto/grpc_server.h"
#include "scd/v1/inference.grpc.pb.h"
#include "serving/checked_inference.h"

namespace scd {
namespace {

v1::GenerateEvent Token(int i) {
  v1::GenerateEvent event;
  event.mutable_token()->add_ids(i);
  return event;
}

// A stream that counts OnRoom.
class CountingStream final : public EventStream {
 public:
  CountingStream(size_t capacity, Ended ended, std::atomic<int>* rooms)
      : EventStream(capacity, std::move(ended)), rooms_(rooms) {}

 private:
  void OnRoom() override { ++*rooms_; }
  std::atomic<int>* const rooms_;
};

// A stream whose pusher waits for room (on its own thread).
class WaitingStream final : public EventStream {
 public:
  using EventStream::EventStream;
  void WaitForRoom() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&room_));
    room_ = false;
  }

 private:
  void OnRoom() override {
    absl::MutexLock lock(&mu_);
    room_ = true;
  }
  absl::Mutex mu_;
  bool room_ = false;
};

// Generate: max_tokens events, by what the prompt names: "wait" pushes from a thread of its own,
// waiting for OnRoom whenever Push says full (capacity 4); "push" pushes them all at once with Push
// (capacity 3) and then ends; "hold" pushes one and waits for the cancellation; "refuse" refuses
// the call.
class Service final : public v1::Inference::CallbackService {
 public:
  grpc::ServerWriteReactor<v1::GenerateEvent>* Generate(
      grpc::CallbackServerContext*, const v1::GenerateRequest* request) override {
    const int n = static_cast<int>(request->max_tokens());
    auto ended = [this](const grpc::Status& status) {
      ended_code = status.error_code();
      absl::MutexLock lock(&ended_mu);
      ++ended_calls;
    };
    if (request->prompt() == "refuse") {
      return RefusedStream(grpc::Status(grpc::StatusCode::OUT_OF_RANGE, "no"), ended);
    }
    if (request->prompt() == "push") {
      auto* stream = new CountingStream(3, ended, &rooms);
      for (int i = 0; i < n; ++i) full_at.push_back(!stream->Push(Token(i)));
      stream->End(grpc::Status::OK);
      return stream;
    }
    auto* stream = new WaitingStream(4, ended);
    stream->Hold();
    const bool hold = request->prompt() == "hold";
    std::thread([this, stream, n, hold] {
      if (hold) {
        stream->Push(Token(0));
        stream->cancellation().WaitUntil(absl::InfiniteFuture());
        cancelled.Notify();
      } else {
        for (int i = 0; i < n; ++i) {
          if (!stream->Push(Token(i))) stream->WaitForRoom();
        }
      }
      stream->End(grpc::Status::OK);
      stream->Release();
    }).detach();
    return stream;
  }

  std::atomic<int> rooms{0};
  std::vector<bool> full_at;
  absl::Mutex ended_mu;
  int ended_calls ABSL_GUARDED_BY(ended_mu) = 0;
  std::atomic<grpc::StatusCode> ended_code{grpc::StatusCode::UNKNOWN};
  absl::Notification cancelled;
};

class EventStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = *StartGrpcServer("127.0.0.1:0", {&service_});
    stub_ = v1::Inference::NewStub(
        grpc::CreateChannel(server_.address, grpc::InsecureChannelCredentials()));
  }
  void TearDown() override { server_.Shutdown(absl::Now() + absl::Seconds(5)); }

  std::unique_ptr<grpc::ClientReader<v1::GenerateEvent>> Call(const std::string& what, int n,
                                                              grpc::ClientContext* context) {
    v1::GenerateRequest request;
    request.set_prompt(what);
    request.set_max_tokens(n);
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return stub_->Generate(context, request);
  }
  // Waits until `calls` calls ended (each end wakes it; 10 s: only a guard against a hang).
  void WaitForEnded(int calls) {
    absl::MutexLock lock(&service_.ended_mu);
    auto ended = [this, calls]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(service_.ended_mu) {
      return service_.ended_calls >= calls;
    };
    service_.ended_mu.AwaitWithTimeout(absl::Condition(&ended), absl::Seconds(10));
    ASSERT_EQ(service_.ended_calls, calls);
  }

  Service service_;
  GrpcServer server_;
  std::unique_ptr<v1::Inference::Stub> stub_;
};

TEST_F(EventStreamTest, EveryEventOnceAndInOrderToASlowReader) {
  grpc::ClientContext context;
  auto reader = Call("wait", 200, &context);
  v1::GenerateEvent event;
  int next = 0;
  while (reader->Read(&event)) {
    ASSERT_EQ(event.token().ids(0), next);
    ++next;
    // paces: a slow reader (the scenario)
    if (next % 50 == 0) absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(next, 200);
  WaitForEnded(1);
  EXPECT_EQ(service_.ended_code.load(), grpc::StatusCode::OK);
}

TEST_F(EventStreamTest, FullAtTheCapacityAndRoomOnceDrained) {
  grpc::ClientContext context;
  auto reader = Call("push", 10, &context);
  v1::GenerateEvent event;
  int next = 0;
  while (reader->Read(&event)) ASSERT_EQ(event.token().ids(0), next++);
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(next, 10);  // nothing dropped though the pusher never waited
  // One write may be under way when the third is queued, so "full" comes at the third or the
  // fourth push, and from then on.
  ASSERT_EQ(service_.full_at.size(), 10u);
  EXPECT_FALSE(service_.full_at[0]);
  EXPECT_FALSE(service_.full_at[1]);
  EXPECT_TRUE(service_.full_at[3]);
  EXPECT_TRUE(service_.full_at[9]);
  WaitForEnded(1);
  EXPECT_GE(service_.rooms.load(), 1);  // the queue drained below its capacity
}

TEST_F(EventStreamTest, AClientThatCancelsReachesTheCancellation) {
  grpc::ClientContext context;
  auto reader = Call("hold", 1, &context);
  v1::GenerateEvent event;
  ASSERT_TRUE(reader->Read(&event));  // the call is running
  context.TryCancel();
  // gRPC tells the stream (OnCancel); nothing else ends the call here.
  ASSERT_TRUE(service_.cancelled.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  WaitForEnded(1);
  EXPECT_EQ(service_.ended_code.load(), grpc::StatusCode::CANCELLED);
}

TEST_F(EventStreamTest, ARefusedStreamEndsWithItsStatusAndNoEvent) {
  grpc::ClientContext context;
  auto reader = Call("refuse", 3, &context);
  v1::GenerateEvent event;
  EXPECT_FALSE(reader->Read(&event));
  const grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_EQ(status.error_message(), "no");
  WaitForEnded(1);
  EXPECT_EQ(service_.ended_code.load(), grpc::StatusCode::OUT_OF_RANGE);
}

}  // namespace
}  // namespace scd
