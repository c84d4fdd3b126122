// What a probe of grpc.health.v1 sees of each daemon over its life (issue 52): a client that is
// not the project's -- Python grpcio, tests/grpc_health_check.py, what Kubernetes' gRPC probes
// and grpc-health-probe ask -- follows a daemon's control port from before it listens until
// after it stopped: NOT_SERVING while it loads (the coordinator waits up to 10 s for an etcd
// that is not there: a load long enough to be seen every time), SERVING once it serves, then at
// SIGTERM NOT_SERVING for the drain and the stream's end. The control port answers it without
// the cluster secret; the public port answers too.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "tests/test_daemon.h"
#include "tests/test_files.h"

namespace scd {
namespace {

using testing::Bin;
using testing::CommandResult;
using testing::Daemon;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using testing::RunCommand;

constexpr char kPython[] = "/usr/bin/python3";
const std::string kCheck = std::string(SCD_SOURCE_DIR) + "/tests/grpc_health_check.py";

// Follows `address` in a thread from now until the daemon stopped (the script's deadline).
class Follower {
 public:
  explicit Follower(const std::string& address)
      : thread_([this, address] {
          result_ = RunCommand(std::string(kPython) + " " + kCheck + " follow " + address +
                               " --deadline 120");
        }) {}
  // What it saw, a line each, once the followed daemon stopped.
  CommandResult Join() {
    thread_.join();
    return result_;
  }

 private:
  CommandResult result_;
  std::thread thread_;
};

std::string Check(const std::string& address, const std::string& service = "") {
  return RunCommand(std::string(kPython) + " " + kCheck + " check " + address +
                    (service.empty() ? "" : " --service " + service))
      .out;
}

// The daemon, SIGTERMed once serving, was seen SERVING, then NOT_SERVING (its drain), then its
// stream ended and its port refused.
void ExpectServedThenDrained(const CommandResult& seen) {
  ASSERT_EQ(seen.exit_code, 0) << seen.out << seen.err;
  EXPECT_THAT(seen.out, HasSubstr("SERVING\nNOT_SERVING\nEND UNAVAILABLE\nREFUSED\n")) << seen.out;
}

TEST(HealthProbeTest, ACoordinatorIsNotServingWhileItWaitsForEtcdThenServesThenDrains) {
  testing::TempDir dir;
  const std::string control = "127.0.0.1:" + std::to_string(testing::FreeLoopbackPort());
  Follower follower(control);
  // etcd on a port nobody listens on: the coordinator waits 10 s for it, then serves anyway.
  Daemon coordinator(
      dir.path(), "coordinator",
      {Bin("scd-coordinator"), "--listen", "127.0.0.1:0", "--control-listen", control, "--registry",
       "etcd://127.0.0.1:" + std::to_string(testing::FreeLoopbackPort())});
  const std::string address = coordinator.Address(absl::Seconds(60));
  ASSERT_FALSE(address.empty());
  EXPECT_EQ(Check(address), "SERVING\n");
  EXPECT_EQ(Check(address, "scd.v1.Inference"), "SERVING\n");
  // The control port answers a probe that has no cluster secret, and only the health service.
  EXPECT_EQ(Check(control, "scd.v1.Registry"), "SERVING\n");
  EXPECT_EQ(Check(control, "scd.v1.Inference"), "NOT_FOUND\n");
  EXPECT_EQ(coordinator.Terminate(absl::Seconds(30)), 0) << coordinator.Ending();
  const CommandResult seen = follower.Join();
  // Loading (refused before it listened, perhaps), then the loading server's NOT_SERVING and its
  // end when the coordinator's own server took the port.
  EXPECT_THAT(seen.out, MatchesRegex("(REFUSED\n)?NOT_SERVING\nEND UNAVAILABLE\n(REFUSED\n)?"
                                     "SERVING\nNOT_SERVING\nEND UNAVAILABLE\nREFUSED\n"))
      << seen.out << seen.err;
  ExpectServedThenDrained(seen);
}

TEST(HealthProbeTest, AProducerAndAConsumerServeThenDrain) {
  testing::TempDir dir;
  const std::string model = testing::ModelDir("stories260k");
  const std::string producer_control = "127.0.0.1:" + std::to_string(testing::FreeLoopbackPort());
  Follower producer_follower(producer_control);
  Daemon producer(dir.path(), "producer",
                  {Bin("scd-producer"), "--model", model, "--control-listen", producer_control});
  ASSERT_FALSE(producer.Address(absl::Seconds(60)).empty());
  EXPECT_EQ(Check(producer_control, "scd.v1.Producer"), "SERVING\n");

  const std::string consumer_control = "127.0.0.1:" + std::to_string(testing::FreeLoopbackPort());
  Follower consumer_follower(consumer_control);
  Daemon consumer(dir.path(), "consumer",
                  {Bin("scd-consumer"), "--model", model, "--listen", "127.0.0.1:0",
                   "--control-listen", consumer_control});
  const std::string consumer_public = consumer.Address(absl::Seconds(60));
  ASSERT_FALSE(consumer_public.empty());
  EXPECT_EQ(Check(consumer_public, "scd.v1.Inference"), "SERVING\n");
  EXPECT_EQ(Check(consumer_control, "scd.v1.Consumer"), "SERVING\n");

  EXPECT_EQ(consumer.Terminate(absl::Seconds(30)), 0) << consumer.Ending();
  EXPECT_EQ(producer.Terminate(absl::Seconds(30)), 0) << producer.Ending();
  ExpectServedThenDrained(consumer_follower.Join());
  ExpectServedThenDrained(producer_follower.Join());
}

}  // namespace
}  // namespace scd
