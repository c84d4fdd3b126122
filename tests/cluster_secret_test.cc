// proto/cluster_secret.h: loading (file, environment, the errors that say how), and the check on a
// real gRPC call: no secret, a wrong one, one of another length, and the right one.
#include "proto/cluster_secret.h"

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>

#include "absl/time/clock.h"
#include "proto/grpc_server.h"
#include "scd/v1/registry.grpc.pb.h"

namespace scd {
namespace {

using ::testing::HasSubstr;

TEST(ClusterSecretTest, LoadsFromAFileElseTheEnvironmentAndSaysHowWhenMissing) {
  const std::string path = ::testing::TempDir() + "/secret";
  std::ofstream(path) << "  file-secret-0123456789abcdef\n";
  setenv(kClusterSecretEnv, "env-secret-0123456789abcdef", 1);
  EXPECT_EQ(ClusterSecret::Load(path)->value(), "file-secret-0123456789abcdef");
  EXPECT_EQ(ClusterSecret::Load("")->value(), "env-secret-0123456789abcdef");
  unsetenv(kClusterSecretEnv);
  absl::Status missing = ClusterSecret::Load("").status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(missing.message()), HasSubstr("SCD_CLUSTER_SECRET"));
  EXPECT_THAT(std::string(ClusterSecret::Of("short").status().message()), HasSubstr("16"));
  EXPECT_FALSE(ClusterSecret::Of("has a space in it somewhere").ok());
  EXPECT_FALSE(ClusterSecret::Load(path + ".absent").ok());
  EXPECT_NE(ClusterSecret::Random().value(), ClusterSecret::Random().value());
}

// A Registry whose Register answers OK once the secret checks.
class GuardedRegistry final : public v1::Registry::Service {
 public:
  explicit GuardedRegistry(ClusterSecret secret) : secret_(std::move(secret)) {}
  grpc::Status Register(grpc::ServerContext* context, const v1::RegisterRequest*,
                        v1::RegisterResponse* response) override {
    if (grpc::Status auth = secret_.Check(*context); !auth.ok()) return auth;
    response->set_node_id("ok");
    return grpc::Status::OK;
  }

 private:
  const ClusterSecret secret_;
};

TEST(ClusterSecretTest, OnlyTheRightSecretPasses) {
  const ClusterSecret secret = *ClusterSecret::Of("the-right-secret-0123456789");
  GuardedRegistry service(secret);
  GrpcServer server = *StartGrpcServer("127.0.0.1:0", {&service});
  auto stub = v1::Registry::NewStub(
      grpc::CreateChannel(server.address, grpc::InsecureChannelCredentials()));
  auto call = [&](const char* sent) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    if (sent != nullptr) context.AddMetadata(kClusterSecretMetadata, sent);
    v1::RegisterResponse response;
    return stub->Register(&context, v1::RegisterRequest(), &response).error_code();
  };
  EXPECT_EQ(call(nullptr), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(call("the-right-secret-0123456788"), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(call("the-right-secret-0123456789x"), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(call(""), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(call("the-right-secret-0123456789"), grpc::StatusCode::OK);
  grpc::ClientContext attached;
  attached.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  secret.Attach(&attached);
  v1::RegisterResponse response;
  EXPECT_TRUE(stub->Register(&attached, v1::RegisterRequest(), &response).ok());
  server.Shutdown(absl::Now());
}

}  // namespace
}  // namespace scd
