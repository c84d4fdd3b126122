// serving/checked_inference.h in front of a recording Inference service, over a real gRPC server:
// invalid UTF-8 anywhere (even nested, even in a repeated field's third element) is refused with
// INVALID_ARGUMENT naming the field, not gRPC's empty INTERNAL; a request past a bound never
// reaches the service; a valid one arrives intact; refusals are counted; Health carries the
// version.
#include "serving/checked_inference.h"

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>

#include "absl/time/clock.h"
#include "proto/grpc_server.h"
#include "scd/v1/control.pb.h"

namespace scd {
namespace {

using ::testing::HasSubstr;

class Recording final : public InferenceBackend {
 public:
  EventStream* Generate(grpc::CallbackServerContext*, v1::GenerateRequest request,
                        EventStream::Ended ended) override {
    ++calls;
    last = request;
    auto* stream = new EventStream(4, std::move(ended));
    v1::GenerateEvent event;
    event.mutable_started()->set_request_id(request.request_id());
    stream->Push(event);
    stream->End(grpc::Status::OK);
    return stream;
  }
  grpc::Status ListModels(v1::ListModelsResponse*) override { return grpc::Status::OK; }
  grpc::Status Health(v1::HealthResponse*) override {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "none here");
  }
  std::atomic<int> calls{0};
  v1::GenerateRequest last;
};

TEST(FindInvalidUtf8Test, NamesTheFieldAtAnyDepth) {
  v1::GenerateRequest request;
  request.set_prompt("fine");
  request.add_stop("a");
  request.add_stop("b");
  request.add_stop("c\xc3");
  EXPECT_EQ(FindInvalidUtf8(*v1::GenerateRequest::descriptor(), request.SerializeAsString()),
            "stop[2]");
  v1::DecodeRequest decode;
  decode.mutable_request()->set_request_id("\xff");
  EXPECT_EQ(FindInvalidUtf8(*v1::DecodeRequest::descriptor(), decode.SerializeAsString()),
            "request.request_id");
  request.set_stop(2, "c");
  EXPECT_EQ(FindInvalidUtf8(*v1::GenerateRequest::descriptor(), request.SerializeAsString()),
            std::nullopt);
}

class CheckedInferenceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    checked_ = std::make_unique<CheckedInferenceService>(&recording_, RequestLimits(), true,
                                                         &refusals_);
    server_ = *StartGrpcServer("127.0.0.1:0", {checked_.get()});
    stub_ = v1::Inference::NewStub(
        grpc::CreateChannel(server_.address, grpc::InsecureChannelCredentials()));
  }
  void TearDown() override { server_.Shutdown(absl::Now()); }
  grpc::Status Generate(const v1::GenerateRequest& request, int* events = nullptr) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    auto reader = stub_->Generate(&context, request);
    v1::GenerateEvent event;
    int n = 0;
    while (reader->Read(&event)) ++n;
    if (events != nullptr) *events = n;
    return reader->Finish();
  }

  Recording recording_;
  Tally refusals_;
  std::unique_ptr<CheckedInferenceService> checked_;
  GrpcServer server_;
  std::unique_ptr<v1::Inference::Stub> stub_;
};

TEST_F(CheckedInferenceTest, RefusesBeforeTheServiceAndPassesTheRestIntact) {
  v1::GenerateRequest request;
  request.set_prompt("caf\xc3\xa9");
  request.add_targets("xs");
  request.set_request_id("client-1");
  int events = 0;
  ASSERT_TRUE(Generate(request, &events).ok());
  EXPECT_EQ(events, 1);
  EXPECT_EQ(recording_.calls.load(), 1);
  // Intact but for the mode, read here once and passed on as the enum (auto: nothing was set).
  v1::GenerateRequest passed = request;
  passed.set_transfer_mode(v1::TRANSFER_MODE_AUTO);
  EXPECT_EQ(recording_.last.SerializeAsString(), passed.SerializeAsString());

  v1::GenerateRequest bad_utf8 = request;
  bad_utf8.set_prompt("caf\xc3(");
  grpc::Status status = Generate(bad_utf8, &events);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(), "prompt: not valid UTF-8");
  EXPECT_EQ(events, 0);
  v1::GenerateRequest bad_target = request;
  bad_target.set_targets(0, "x\xed\xa0\x80");
  EXPECT_EQ(Generate(bad_target).error_message(), "targets[0]: not valid UTF-8");
  v1::GenerateRequest too_many = request;
  too_many.set_max_tokens(~0u);
  EXPECT_EQ(Generate(too_many).error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_EQ(recording_.calls.load(), 1);  // none of them reached the service
  EXPECT_EQ(refusals_.Get("refused_invalid_argument"), 2u);
  EXPECT_EQ(refusals_.Get("refused_out_of_range"), 1u);

  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::HealthResponse health;
  EXPECT_EQ(stub_->Health(&context, v1::HealthRequest(), &health).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);  // the recording service has none: passed on
}

TEST(BuildVersionTest, NamesTheProjectVersion) {
  EXPECT_THAT(std::string(BuildVersion()), HasSubstr("0.1.0"));
}

}  // namespace
}  // namespace scd
