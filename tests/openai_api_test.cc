// The OpenAI front end (coordinator/openai_api.h) over a scripted scd.v1.Inference node (an
// in-process channel, as the coordinator's): a stream the node ends before its Finished --
// UNAVAILABLE, or cancelled by the server as a drain past its grace does -- ends with an error
// event that says an OpenAI stream cannot be resumed and that a gRPC client resumes it, never
// with a bare [DONE] that looks complete; a client that left is not written to.
// (tests/openai_client_test.cc runs the official client against a real server.)
#include "coordinator/openai_api.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "base/cancellation.h"
#include "base/grpc_library.h"
#include "scd/v1/inference.grpc.pb.h"
#include "serving/event_stream.h"

namespace scd::coordinator {
namespace {

enum class Ending { kUnavailable, kUntilCancelled };

// A stream that ends CANCELLED when its call is cancelled (the server's shutdown, the client's
// cancel): on gRPC's OnCancel, no polling.
class EndsWhenCancelled final : public EventStream {
 public:
  EndsWhenCancelled() : EventStream(4, {}) {
    Hold();
    registration_ = cancellation().OnCancel([this](const absl::Status&) {
      End(grpc::Status::CANCELLED);
      Release();
    });
  }

 private:
  ~EndsWhenCancelled() override = default;
  Cancellation::Registration registration_;
};

// Streams Started (with a resume token) and one token, then ends as told.
class ScriptedNode final : public v1::Inference::CallbackService {
 public:
  explicit ScriptedNode(Ending ending) : ending_(ending) {}
  grpc::ServerWriteReactor<v1::GenerateEvent>* Generate(
      grpc::CallbackServerContext*, const v1::GenerateRequest* request) override {
    EventStream* stream =
        ending_ == Ending::kUnavailable ? new EventStream(4, {}) : new EndsWhenCancelled();
    v1::GenerateEvent started;
    started.set_target(request->targets(0));
    started.mutable_started()->set_resume_token("opaque");
    stream->Push(started);
    v1::GenerateEvent token;
    token.set_target(request->targets(0));
    token.mutable_token()->set_text(" upon");
    token.mutable_token()->add_ids(7);
    stream->Push(token);
    if (ending_ == Ending::kUnavailable) {
      stream->End(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the coordinator is going away"));
    }
    return stream;
  }

 private:
  const Ending ending_;
};

// Records what the handler sends; the exchange can be closed as a leaving client closes it.
class RecordingReply final : public HttpReply {
 public:
  void Send(HttpResponse response) override {
    std::lock_guard<std::mutex> lock(mu_);
    body_ = response.body;
    done_ = true;
    cv_.notify_all();
  }
  void StartStream(HttpResponse) override {}
  bool Write(std::string data) override {
    std::lock_guard<std::mutex> lock(mu_);
    body_ += data;
    cv_.notify_all();
    return true;
  }
  void End() override {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    cv_.notify_all();
  }
  void OnRoom(std::function<void()> room) override { room(); }
  void OnClosed(std::function<void()> closed) override {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = std::move(closed);
  }
  void Close() {
    std::function<void()> closed;
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed.swap(closed_);
    }
    if (closed) closed();
  }
  // Waits (up to 30 s: a hang, not a latency bound) until `text` was sent or the answer ended.
  std::string WaitFor(const std::string& text) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(30),
                 [&] { return done_ || body_.find(text) != std::string::npos; });
    return body_;
  }
  std::string WaitForEnd() { return WaitFor("\x01never"); }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::string body_;
  bool done_ = false;
  std::function<void()> closed_;
};

struct Node {
  explicit Node(Ending ending) : service(ending) {
    // A bare server, as the node's own (proto/grpc_server.h) takes the hold: the handler's call
    // may outlive this Node and drop the channel's last reference on gRPC's thread.
    HoldGrpcLibrary();
    grpc::ServerBuilder builder;
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
    handler = std::make_unique<OpenAiHttpHandler>(
        server->InProcessChannel(grpc::ChannelArguments()), nullptr, nullptr);
  }
  ~Node() { server->Shutdown(std::chrono::system_clock::now()); }
  void Stream(const std::shared_ptr<RecordingReply>& reply) {
    HttpRequest request;
    request.method = "POST";
    request.path = "/v1/completions";
    request.body = R"({"model": "m", "prompt": "Once", "max_tokens": 8, "stream": true})";
    ASSERT_TRUE(handler->Handle(request, reply));
  }
  ScriptedNode service;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<OpenAiHttpHandler> handler;
};

constexpr char kNamesTheResume[] = "an OpenAI stream cannot be resumed";

TEST(OpenAiApiTest, AStreamItsCoordinatorEndsNamesTheResume) {
  Node node(Ending::kUnavailable);
  auto reply = std::make_shared<RecordingReply>();
  node.Stream(reply);
  const std::string body = reply->WaitForEnd();
  const size_t token = body.find(" upon");
  const size_t error = body.find("\"error\"");
  ASSERT_NE(token, std::string::npos) << body;
  ASSERT_NE(error, std::string::npos) << body;
  EXPECT_LT(token, error);
  EXPECT_NE(body.find("the coordinator is going away"), std::string::npos) << body;
  EXPECT_NE(body.find(kNamesTheResume), std::string::npos) << body;
  EXPECT_NE(body.find("resume_token"), std::string::npos) << body;
  EXPECT_LT(error, body.find("data: [DONE]"));
}

// A drain past its grace cancels the node's calls: without an error the stream would end in a
// bare [DONE], as if complete.
TEST(OpenAiApiTest, AStreamTheServerCancelsEndsInAnErrorNotABareDone) {
  auto node = std::make_unique<Node>(Ending::kUntilCancelled);
  auto reply = std::make_shared<RecordingReply>();
  node->Stream(reply);
  ASSERT_NE(reply->WaitFor(" upon").find(" upon"), std::string::npos);
  node->server->Shutdown(std::chrono::system_clock::now());  // the grace is over
  const std::string body = reply->WaitForEnd();
  EXPECT_NE(body.find(kNamesTheResume), std::string::npos) << body;
  EXPECT_NE(body.find("data: [DONE]"), std::string::npos) << body;
}

TEST(OpenAiApiTest, AClientThatLeftGetsNoError) {
  Node node(Ending::kUntilCancelled);
  auto reply = std::make_shared<RecordingReply>();
  node.Stream(reply);
  ASSERT_NE(reply->WaitFor(" upon").find(" upon"), std::string::npos);
  reply->Close();  // the client went away: the call is cancelled
  const std::string body = reply->WaitForEnd();
  EXPECT_EQ(body.find("\"error\""), std::string::npos) << body;
}

}  // namespace
}  // namespace scd::coordinator
