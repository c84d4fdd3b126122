// grpc.health.v1.Health on a node's gRPC server (proto/health_service.h), through gRPC's own
// generated client: Check and Watch, unknown services, the Watch cap, a stop that ends the
// streams, and the loading server a node shows while it loads.
#include "proto/health_service.h"

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "proto/grpc_server.h"
#include "scd/v1/registry.grpc.pb.h"

namespace scd {
namespace {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

// Far beyond a local call's milliseconds: a call that hangs fails here instead of the suite.
constexpr auto kCallDeadline = std::chrono::seconds(20);

std::unique_ptr<Health::Stub> StubFor(const std::string& address) {
  return Health::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

// Check's status, or its error code as a negative number.
int CheckStatus(Health::Stub* stub, const std::string& service) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kCallDeadline);
  HealthCheckRequest request;
  request.set_service(service);
  HealthCheckResponse response;
  const grpc::Status status = stub->Check(&context, request, &response);
  if (!status.ok()) return -static_cast<int>(status.error_code());
  return response.status();
}

// One Watch stream read a message at a time.
class WatchStream {
 public:
  WatchStream(Health::Stub* stub, const std::string& service) {
    context_.set_deadline(std::chrono::system_clock::now() + kCallDeadline);
    HealthCheckRequest request;
    request.set_service(service);
    reader_ = stub->Watch(&context_, request);
  }
  // The next status, or -1 once the stream ended.
  int Next() {
    HealthCheckResponse response;
    if (!reader_->Read(&response)) return -1;
    return response.status();
  }
  grpc::Status Finish() { return reader_->Finish(); }
  void Cancel() { context_.TryCancel(); }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReader<HealthCheckResponse>> reader_;
};

class HealthServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<GrpcServer> started =
        StartGrpcServer("127.0.0.1:0", {&registry_}, {}, 0, {v1::Registry::service_full_name()});
    ASSERT_TRUE(started.ok()) << started.status();
    server_ = *std::move(started);
    stub_ = StubFor(server_.address);
  }

  v1::Registry::Service registry_;  // every method UNIMPLEMENTED: a service to name
  GrpcServer server_;
  std::unique_ptr<Health::Stub> stub_;
};

TEST_F(HealthServiceTest, CheckAnswersTheNodesStatusForItAndItsServicesAndRefusesOthers) {
  EXPECT_EQ(CheckStatus(stub_.get(), ""), HealthCheckResponse::NOT_SERVING);
  server_.health->SetServing(true);
  EXPECT_EQ(CheckStatus(stub_.get(), ""), HealthCheckResponse::SERVING);
  EXPECT_EQ(CheckStatus(stub_.get(), "scd.v1.Registry"), HealthCheckResponse::SERVING);
  EXPECT_EQ(CheckStatus(stub_.get(), "scd.v1.Inference"),
            -static_cast<int>(grpc::StatusCode::NOT_FOUND));
  server_.health->SetServing(false);
  EXPECT_EQ(CheckStatus(stub_.get(), "scd.v1.Registry"), HealthCheckResponse::NOT_SERVING);
}

TEST_F(HealthServiceTest, WatchSendsTheStatusThenEachChange) {
  WatchStream watch(stub_.get(), "");
  EXPECT_EQ(watch.Next(), HealthCheckResponse::NOT_SERVING);
  server_.health->SetServing(true);
  EXPECT_EQ(watch.Next(), HealthCheckResponse::SERVING);
  server_.health->SetServing(true);  // no change: nothing sent
  server_.health->SetServing(false);
  EXPECT_EQ(watch.Next(), HealthCheckResponse::NOT_SERVING);
  // A stop ends the stream at once (UNAVAILABLE), not at the stop's deadline.
  const absl::Time before = absl::Now();
  server_.Shutdown(absl::Now() + absl::Seconds(30));
  EXPECT_EQ(watch.Next(), -1);
  EXPECT_EQ(watch.Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_LT(absl::Now() - before, absl::Seconds(30));
}

TEST_F(HealthServiceTest, AnUnknownServicesWatchSaysSoAndStaysSo) {
  WatchStream watch(stub_.get(), "no.such.Service");
  EXPECT_EQ(watch.Next(), HealthCheckResponse::SERVICE_UNKNOWN);
  server_.health->SetServing(true);
  WatchStream known(stub_.get(), "scd.v1.Registry");
  EXPECT_EQ(known.Next(), HealthCheckResponse::SERVING);
  server_.health->SetServing(false);
  EXPECT_EQ(known.Next(), HealthCheckResponse::NOT_SERVING);
  watch.Cancel();
  EXPECT_EQ(watch.Next(), -1);
  EXPECT_EQ(watch.Finish().error_code(), grpc::StatusCode::CANCELLED);
}

TEST(HealthServiceCapTest, TheThirdWatchOnAPortCappedAtTwoIsRefused) {
  HealthService health({}, 2);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&health);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  std::unique_ptr<Health::Stub> stub = StubFor("127.0.0.1:" + std::to_string(port));
  auto first = std::make_unique<WatchStream>(stub.get(), "");
  WatchStream second(stub.get(), "");
  EXPECT_EQ(first->Next(), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(second.Next(), HealthCheckResponse::NOT_SERVING);
  {
    WatchStream third(stub.get(), "");
    EXPECT_EQ(third.Next(), -1);
    const grpc::Status refused = third.Finish();
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(refused.error_message(), ::testing::HasSubstr("at most 2"));
  }
  // Check is never capped.
  EXPECT_EQ(CheckStatus(stub.get(), ""), HealthCheckResponse::NOT_SERVING);
  first->Cancel();
  EXPECT_EQ(first->Next(), -1);
  first->Finish();
  first.reset();
  // The cancelled stream leaves the count once gRPC is done with it (OnDone, on its own thread).
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  while (health.watches() > 1 && absl::Now() < give_up) {
    // waits: gRPC's OnDone for the cancelled stream, on a thread of gRPC's
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(health.watches(), 1);
  WatchStream fourth(stub.get(), "");
  EXPECT_EQ(fourth.Next(), HealthCheckResponse::NOT_SERVING);
  health.EndWatches();
  EXPECT_EQ(second.Next(), -1);
  EXPECT_EQ(fourth.Next(), -1);
  server->Shutdown();
}

// While a node loads, its ports answer health checks NOT_SERVING and nothing else; loaded, it
// serves its own services on the very address the loading server bound.
TEST(LoadingServerTest, ShowsNotServingThenHandsItsAddressToTheNodesServer) {
  absl::StatusOr<GrpcServer> loading = StartLoadingServer("127.0.0.1:0");
  ASSERT_TRUE(loading.ok()) << loading.status();
  const std::string address = loading->address;
  std::unique_ptr<Health::Stub> stub = StubFor(address);
  EXPECT_EQ(CheckStatus(stub.get(), ""), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(CheckStatus(stub.get(), "scd.v1.Registry"),
            -static_cast<int>(grpc::StatusCode::NOT_FOUND));
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kCallDeadline);
    v1::HeartbeatRequest request;
    v1::HeartbeatResponse response;
    const grpc::Status status =
        v1::Registry::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))
            ->Heartbeat(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  }
  v1::Registry::Service registry;
  absl::StatusOr<GrpcServer> served =
      ServeAfterLoading(&*loading, {&registry}, {v1::Registry::service_full_name()});
  ASSERT_TRUE(served.ok()) << served.status();
  EXPECT_EQ(served->address, address);
  served->health->SetServing(true);
  std::unique_ptr<Health::Stub> again = StubFor(address);
  EXPECT_EQ(CheckStatus(again.get(), "scd.v1.Registry"), HealthCheckResponse::SERVING);
}

}  // namespace
}  // namespace scd
