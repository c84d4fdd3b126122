// The shared gRPC helpers: status conversion keeps code and message both ways; a server bound on
// HOST:0 reports HOST:PORT; nodes advertise a dialable address (the --advertise host, the host
// name for a wildcard listener, else the bound address); a server starts on any port or says where
// it cannot listen, and once shut down its port refuses a client's next call at once.
#include "proto/grpc_util.h"

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>

#include "absl/time/clock.h"
#include "proto/grpc_server.h"
#include "scd/v1/registry.grpc.pb.h"

namespace scd {
namespace {

using ::testing::HasSubstr;

TEST(GrpcUtilTest, StatusConversionKeepsCodeAndMessage) {
  const absl::Status status = absl::ResourceExhaustedError("4 of 4 running");
  const grpc::Status converted = ToGrpcStatus(status);
  EXPECT_EQ(converted.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(converted.error_message(), "4 of 4 running");
  EXPECT_EQ(FromGrpcStatus(converted), status);
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
}

TEST(GrpcUtilTest, BoundAddressTakesThePortTheServerGot) {
  EXPECT_EQ(BoundAddress("127.0.0.1:0", 40123), "127.0.0.1:40123");
  EXPECT_EQ(BoundAddress("0.0.0.0:7000", 7000), "0.0.0.0:7000");
}

TEST(GrpcUtilTest, AdvertisedAddressIsDialable) {
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof(host) - 1), 0);
  EXPECT_EQ(AdvertisedAddress("0.0.0.0:7000", "node-3.cluster"), "node-3.cluster:7000");
  EXPECT_EQ(AdvertisedAddress("127.0.0.1:7000", "10.0.0.5"), "10.0.0.5:7000");
  EXPECT_EQ(AdvertisedAddress("[::]:7000", "[::1]"), "[::1]:7000");
  EXPECT_EQ(AdvertisedAddress("[::]:7000", "::1"), "[::1]:7000");
  EXPECT_EQ(AdvertisedAddress("0.0.0.0:7000", ""), std::string(host) + ":7000");
  EXPECT_EQ(AdvertisedAddress("[::]:7001", ""), std::string(host) + ":7001");
  EXPECT_EQ(AdvertisedAddress("10.1.2.3:7002", ""), "10.1.2.3:7002");
}

TEST(GrpcServerTest, StartsOnAnyPortOrSaysWhereItCannotListen) {
  v1::Registry::Service service;  // every method UNIMPLEMENTED: enough to serve
  absl::StatusOr<GrpcServer> served = StartGrpcServer("127.0.0.1:0", {&service});
  ASSERT_TRUE(served.ok()) << served.status();
  EXPECT_EQ(served->address.rfind("127.0.0.1:", 0), 0u);
  EXPECT_NE(served->address, "127.0.0.1:0");
  absl::StatusOr<GrpcServer> bad = StartGrpcServer("256.0.0.1:0", {&service});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("cannot listen on 256.0.0.1:0"));
  // A port in use is refused (no SO_REUSEPORT: gRPC's default would share it silently).
  absl::StatusOr<GrpcServer> twice = StartGrpcServer(served->address, {&service});
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(twice.status().message()), HasSubstr("already in use"));
  served->Shutdown(absl::Now());
}

// A client whose channel was connected to a server that is then shut down (a node a test kills,
// a daemon that stopped) gets UNAVAILABLE on its next call, from the refused reconnection. The
// stopped server's listening socket used to stay open until the server object went away, so the
// channel reconnected into a backlog nobody accepted and the call waited for its deadline
// (DEADLINE_EXCEEDED here; a coordinator's node call waited ~1.5 s for its keepalive).
TEST(GrpcServerTest, AShutDownServersPortRefusesTheNextCall) {
  v1::Registry::Service service;  // every method UNIMPLEMENTED: an answer is enough
  absl::StatusOr<GrpcServer> served = StartGrpcServer("127.0.0.1:0", {&service});
  ASSERT_TRUE(served.ok()) << served.status();
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel(served->address, grpc::InsecureChannelCredentials());
  auto stub = v1::Registry::NewStub(channel);
  auto call = [&] {
    grpc::ClientContext context;
    // Far beyond a refusal's milliseconds: a call that waits on a silent connection ends here.
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    v1::RegisterResponse response;
    return stub->Register(&context, v1::RegisterRequest(), &response).error_code();
  };
  ASSERT_EQ(call(), grpc::StatusCode::UNIMPLEMENTED);  // connected
  ASSERT_EQ(channel->GetState(false), GRPC_CHANNEL_READY);
  served->Shutdown(absl::Now());
  // The channel has seen its connection close: the next call connects anew.
  ASSERT_TRUE(channel->WaitForStateChange(
      GRPC_CHANNEL_READY, std::chrono::system_clock::now() + std::chrono::seconds(20)));
  EXPECT_EQ(call(), grpc::StatusCode::UNAVAILABLE);
}

}  // namespace
}  // namespace scd
