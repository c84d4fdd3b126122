// What tests that run the daemons as processes ask of them through their APIs: wait until the
// coordinator routes to N models, and read a node's Stats over its control plane (with the test
// cluster secret). Header-only: the tests that use it already link gRPC and the protos.
#ifndef SCD_TESTS_CLUSTER_CLIENT_H_
#define SCD_TESTS_CLUSTER_CLIENT_H_

#include <grpcpp/create_channel.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "absl/time/clock.h"
#include "proto/inference_client.h"
#include "scd/v1/control.grpc.pb.h"
#include "tests/test_daemon.h"

namespace scd::testing {

// Whether `server` lists `models` models within `timeout` (the nodes registered).
inline bool WaitForModels(const std::string& server, size_t models, absl::Duration timeout) {
  const absl::Time limit = absl::Now() + timeout;
  while (absl::Now() < limit) {
    auto listed = ListModels(server, absl::Seconds(2));
    if (listed.ok() && listed->size() == models) return true;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return false;
}

// A node's Stats; `Service` is v1::Producer or v1::Consumer (their control planes serve Stats).
template <typename Service>
v1::NodeStats StatsOf(Daemon& daemon) {
  auto stub = Service::NewStub(
      grpc::CreateChannel(daemon.ControlAddress(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  context.AddMetadata("x-scd-cluster-secret", kTestClusterSecret);
  v1::NodeStats stats;
  const grpc::Status status = stub->Stats(&context, v1::StatsRequest(), &stats);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return stats;
}

}  // namespace scd::testing

#endif  // SCD_TESTS_CLUSTER_CLIENT_H_
