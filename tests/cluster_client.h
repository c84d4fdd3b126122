// What tests that run the daemons as processes ask of them through their APIs: wait until the
// coordinator routes to N models, and read a node's Stats over its control plane (with the test
// cluster secret), or wait for them to reach a state; every wait is a long poll on the node's
// changes (control.proto StatsRequest), never a timed retry. Header-only: the tests that use it
// already link gRPC and the protos.
#ifndef SCD_TESTS_CLUSTER_CLIENT_H_
#define SCD_TESTS_CLUSTER_CLIENT_H_

#include <grpcpp/create_channel.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <set>
#include <string>

#include "absl/time/clock.h"
#include "proto/inference_client.h"
#include "scd/v1/control.grpc.pb.h"
#include "scd/v1/registry.grpc.pb.h"
#include "tests/test_daemon.h"

namespace scd::testing {

// A node's Stats; `Service` is v1::Producer, v1::Consumer or v1::Registry (the coordinator): their
// control planes serve Stats. With `wait` > 0 a long poll (control.proto StatsRequest): answered
// once the node's process changed something after `after_change`, or after `wait`.
template <typename Service>
v1::NodeStats StatsOf(Daemon& daemon, uint64_t after_change = 0,
                      absl::Duration wait = absl::ZeroDuration()) {
  auto stub = Service::NewStub(
      grpc::CreateChannel(daemon.ControlAddress(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + wait + absl::Seconds(5)));
  context.AddMetadata("x-scd-cluster-secret", kTestClusterSecret);
  v1::StatsRequest request;
  request.set_after_change(after_change);
  request.set_wait_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(wait)));
  v1::NodeStats stats;
  const grpc::Status status = stub->Stats(&context, request, &stats);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return stats;
}

// The node's Stats once `holds` them, read again on each of the node's changes (a long poll,
// never a timed retry), or the last ones read when `timeout` is over (the caller checks).
template <typename Service>
v1::NodeStats AwaitStats(Daemon& daemon, const std::function<bool(const v1::NodeStats&)>& holds,
                         absl::Duration timeout) {
  const absl::Time limit = absl::Now() + timeout;
  v1::NodeStats stats = StatsOf<Service>(daemon);
  while (!holds(stats) && absl::Now() < limit) {
    stats = StatsOf<Service>(daemon, stats.change_count(), limit - absl::Now());
  }
  return stats;
}

// Whether the names of the models the coordinator lists satisfy `holds` within `timeout`: read
// again on each change of its registry (a long poll on its Stats), never on a timer.
inline bool AwaitModels(Daemon& coordinator,
                        const std::function<bool(const std::set<std::string>&)>& holds,
                        absl::Duration timeout) {
  const std::string server = coordinator.Address();
  const absl::Time limit = absl::Now() + timeout;
  uint64_t seen = 0;
  for (;;) {
    auto listed = ListModels(server, absl::Seconds(2));
    std::set<std::string> names;
    if (listed.ok()) {
      for (const v1::ModelInfo& model : *listed) names.insert(model.name());
      if (holds(names)) return true;
    }
    if (absl::Now() >= limit) return false;
    seen = StatsOf<v1::Registry>(coordinator, seen, limit - absl::Now()).change_count();
  }
}

// Whether the coordinator lists `models` models within `timeout` (the nodes registered, or the
// ones gone are out).
inline bool WaitForModels(Daemon& coordinator, size_t models, absl::Duration timeout) {
  return AwaitModels(
      coordinator, [models](const std::set<std::string>& names) { return names.size() == models; },
      timeout);
}

}  // namespace scd::testing

#endif  // SCD_TESTS_CLUSTER_CLIENT_H_
