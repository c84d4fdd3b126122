// The consumer's Inference service through a real gRPC server and client over loopback: Generate
// streams the consumer's own greedy generation (checked against GenerateTextFromIds); requests the
// consumer cannot serve are refused with their own codes (NOT_FOUND naming it, FAILED_PRECONDITION,
// RESOURCE_EXHAUSTED when full, UNAVAILABLE while draining); a client that cancels frees its slot.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "base/work_queue.h"
#include "consumer/inference_service.h"
#include "model/generator.h"
#include "proto/grpc_server.h"
#include "proto/wire_mode.h"
#include "serving/checked_inference.h"
#include "tests/test_util.h"

namespace scd::consumer {
namespace {

using ::testing::HasSubstr;

class ConsumerServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = testing::Ok(LlamaModel::Load(testing::ModelDir("stories260k"), {}));
    tokenizer_ =
        testing::Ok(Tokenizer::FromFile(testing::ModelDir("stories260k") + "/tokenizer.json"));
    // The consumer's scheduler, as a node runs one.
    scheduler_ = std::make_unique<DecodeScheduler>(*model_, SchedulerOptions());
    ConsumerModel consumer{model_.get(), tokenizer_.get(), "fables", TransferOptions(),
                           16,           absl::Seconds(30)};
    consumer.scheduler = scheduler_.get();
    consumer.steps = &steps_;
    service_ = std::make_unique<ConsumerInferenceService>(consumer, "fp-fables",
                                                          Admission::Create(1), &refusals_);
    // Served as a node serves it: the checked front first (serving/checked_inference.h).
    checked_ = std::make_unique<CheckedInferenceService>(service_.get(), RequestLimits(),
                                                         /*require_target=*/false, &refusals_);
    server_ = testing::Ok(StartGrpcServer("127.0.0.1:0", {checked_.get()}));
    stub_ = v1::Inference::NewStub(
        grpc::CreateChannel(server_.address, grpc::InsecureChannelCredentials()));
  }
  void TearDown() override { server_.Shutdown(absl::Now()); }

  struct Call {
    grpc::Status status;
    std::vector<v1::GenerateEvent> events;
  };
  Call Generate(const v1::GenerateRequest& request) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    auto reader = stub_->Generate(&context, request);
    Call call;
    v1::GenerateEvent event;
    while (reader->Read(&event)) call.events.push_back(event);
    call.status = reader->Finish();
    return call;
  }

  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  Tally refusals_;
  std::unique_ptr<DecodeScheduler> scheduler_;
  WorkQueue steps_{2};
  std::unique_ptr<ConsumerInferenceService> service_;
  std::unique_ptr<CheckedInferenceService> checked_;
  GrpcServer server_;
  std::unique_ptr<v1::Inference::Stub> stub_;
};

TEST_F(ConsumerServiceTest, GenerateStreamsTheConsumersOwnGreedyGeneration) {
  v1::GenerateRequest request;
  request.set_prompt("Once upon a time");
  request.set_max_tokens(16);
  Call call = Generate(request);
  ASSERT_TRUE(call.status.ok()) << call.status.error_message();
  ASSERT_GE(call.events.size(), 2u);
  ASSERT_TRUE(call.events.front().has_started());
  EXPECT_EQ(RanModeName(call.events.front().started()), "local");
  EXPECT_THAT(call.events.front().started().mode_reason(), HasSubstr("no producer"));
  EXPECT_FALSE(call.events.front().started().request_id().empty());
  ASSERT_TRUE(call.events.back().has_finished());
  std::vector<TokenId> ids;
  std::string text;
  for (const auto& event : call.events) {
    EXPECT_EQ(event.target(), "fables");
    if (!event.has_token()) continue;
    text += event.token().text();
    for (int32_t id : event.token().ids()) ids.push_back(id);
  }
  GenerationOptions options;
  options.max_tokens = 16;
  GenerationResult reference =
      testing::Ok(GenerateText(*model_, *tokenizer_, "Once upon a time", options));
  EXPECT_EQ(ids, reference.output_ids);
  EXPECT_EQ(text, reference.text);
  EXPECT_EQ(call.events.back().finished().output_tokens(), reference.output_ids.size());
}

TEST_F(ConsumerServiceTest, RequestsItCannotServeAreRefusedWithTheirOwnCodes) {
  v1::GenerateRequest request;
  request.set_prompt("Once upon a time");
  request.add_targets("xs");
  Call unknown = Generate(request);
  EXPECT_EQ(unknown.status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(unknown.status.error_message(), HasSubstr("'fables'"));
  EXPECT_TRUE(unknown.events.empty());

  request.clear_targets();
  SetRequestMode(*ParseRequestedMode("scd"), &request);
  EXPECT_EQ(Generate(request).status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);

  SetRequestMode(*ParseRequestedMode("local"), &request);
  {
    auto held = service_->admission()->Admit();  // the only slot is taken
    ASSERT_TRUE(held.ok());
    Call full = Generate(request);
    EXPECT_EQ(full.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_TRUE(full.events.empty());
  }
  EXPECT_TRUE(Generate(request).status.ok());  // the slot came back

  // Bad input is refused as a whole before admission: a non-OK call, no event, counted.
  v1::GenerateRequest empty;
  Call bad = Generate(empty);
  EXPECT_EQ(bad.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad.status.error_message(), HasSubstr("prompt"));
  EXPECT_TRUE(bad.events.empty());
  v1::GenerateRequest both = request;
  both.add_prompt_ids(1);
  Call twice = Generate(both);
  EXPECT_EQ(twice.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(twice.status.error_message(), HasSubstr("prompt and prompt_ids"));
  EXPECT_TRUE(twice.events.empty());
  // Past the model's room (512 positions): OUT_OF_RANGE naming max_tokens, before any work.
  v1::GenerateRequest long_output = request;
  long_output.set_max_tokens(510);
  Call too_long = Generate(long_output);
  EXPECT_EQ(too_long.status.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_THAT(too_long.status.error_message(), HasSubstr("max_tokens"));
  EXPECT_TRUE(too_long.events.empty());
  EXPECT_EQ(refusals_.Get("refused_invalid_argument"), 2u);
  EXPECT_EQ(refusals_.Get("refused_out_of_range"), 1u);
  EXPECT_EQ(refusals_.Get("refused_not_found"), 1u);
  EXPECT_EQ(refusals_.Get("refused_resource_exhausted"), 1u);

  service_->admission()->Drain();
  EXPECT_EQ(Generate(request).status.error_code(), grpc::StatusCode::UNAVAILABLE);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::HealthResponse health;
  ASSERT_TRUE(stub_->Health(&context, v1::HealthRequest(), &health).ok());
  EXPECT_EQ(health.status(), "draining");
  EXPECT_EQ(health.version(), BuildVersion());
  EXPECT_FALSE(health.version().empty());
}

TEST_F(ConsumerServiceTest, ClientCancelFreesTheSlot) {
  v1::GenerateRequest request;
  request.set_prompt("Once upon a time");
  request.set_max_tokens(400);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto reader = stub_->Generate(&context, request);
  v1::GenerateEvent event;
  ASSERT_TRUE(reader->Read(&event));  // Started: admitted and running
  EXPECT_EQ(service_->admission()->active(), 1u);
  context.TryCancel();
  while (reader->Read(&event)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  // The request's end releases its reservation (30 s: only a guard against a hang).
  EXPECT_TRUE(service_->admission()->AwaitIdle(absl::Now() + absl::Seconds(30)));
}

}  // namespace
}  // namespace scd::consumer
