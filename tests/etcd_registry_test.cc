// Scale-out over a real etcd (Debian's etcd-server): two coordinators and three nodes with
// --registry etcd://; requests through either coordinator succeed; a SIGKILLed coordinator leaves
// the other serving; a SIGKILLed consumer leaves routing within its 10 s lease (its key expires,
// the watches drop it); a node stopped with SIGTERM leaves at once (lease revoked); node ids are
// "<role>-" + 32 hex digits, one key each.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <regex>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/child_process.h"
#include "base/etcd_client.h"
#include "proto/inference_client.h"
#include "proto/registry_client.h"
#include "tests/cluster_client.h"
#include "tests/etcd_server.h"
#include "tests/test_daemon.h"
#include "tests/test_files.h"

namespace scd {
namespace {

using testing::Bin;
using testing::Daemon;

std::set<std::string> Models(const std::string& server) {
  std::set<std::string> names;
  auto models = ListModels(server, absl::Seconds(2));
  if (models.ok()) {
    for (const auto& m : *models) names.insert(m.name());
  }
  return names;
}

absl::Status Generate(const std::string& server, const std::string& target) {
  v1::GenerateRequest request;
  request.set_prompt("Once upon a time");
  request.add_targets(target);
  request.set_max_tokens(4);
  bool finished = false;
  absl::Status status = StreamGenerate(server, request, absl::Seconds(30),
                                       [&](const v1::GenerateEvent& e) {
                                         if (e.has_finished()) finished = true;
                                       });
  if (status.ok() && !finished) return absl::InternalError("no Finished event");
  return status;
}

TEST(EtcdRegistryTest, TwoCoordinatorsShareTheNodesAndLeasesDropTheDead) {
  testing::TempDir dir;
  auto etcd = testing::EtcdServer::Start(dir.path());
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  const std::string registry = (*etcd)->registry();
  const EtcdClient* client = &(*etcd)->client();

  auto coordinator = [&](const std::string& name) {
    return std::make_unique<Daemon>(
        dir.path(), name,
        std::vector<std::string>{Bin("scd-coordinator"), "--listen", "127.0.0.1:0",
                                 "--control-listen", "127.0.0.1:0", "--registry", registry});
  };
  auto a = coordinator("coordinator-a");
  auto b = coordinator("coordinator-b");
  const std::string server_a = a->Address(), server_b = b->Address();
  ASSERT_FALSE(server_a.empty());
  ASSERT_FALSE(server_b.empty());
  const std::string model = testing::ModelDir("stories260k");
  Daemon producer(dir.path(), "producer",
                  {Bin("scd-producer"), "--model", model, "--registry", registry});
  auto consumer = [&](const std::string& name) {
    return std::make_unique<Daemon>(
        dir.path(), name,
        std::vector<std::string>{Bin("scd-consumer"), "--model", model, "--name", name,
                                 "--registry", registry});
  };
  auto copy = consumer("copy");
  auto spare = consumer("spare");
  const std::set<std::string> all = {"stories260k", "copy", "spare"};
  auto all_listed = [&all](const std::set<std::string>& names) { return names == all; };
  ASSERT_TRUE(testing::AwaitModels(*a, all_listed, absl::Seconds(60))) << "logs in " << dir.path();
  ASSERT_TRUE(testing::AwaitModels(*b, all_listed, absl::Seconds(60))) << "logs in " << dir.path();
  ASSERT_EQ(Models(server_a), all) << "logs in " << dir.path();
  ASSERT_EQ(Models(server_b), all);

  // One key per node, ids "<role>-" and 32 hex digits.
  absl::StatusOr<std::vector<EtcdKeyValue>> keys = client->Range(kEtcdNodesPrefix);
  ASSERT_TRUE(keys.ok());
  ASSERT_EQ(keys->size(), 3u);
  const std::regex id(std::string(kEtcdNodesPrefix) + "(producer|consumer)-[0-9a-f]{32}");
  for (const EtcdKeyValue& kv : *keys) EXPECT_TRUE(std::regex_match(kv.key, id)) << kv.key;

  // Either coordinator routes to both consumers.
  for (const std::string& server : {server_a, server_b}) {
    for (const char* target : {"copy", "spare"}) {
      const absl::Status served = Generate(server, target);
      EXPECT_TRUE(served.ok()) << server << " -> " << target << ": " << served;
    }
  }

  // A coordinator dies: the other serves on.
  a->Kill(SIGKILL);
  EXPECT_TRUE(Generate(server_b, "copy").ok());

  // A consumer dies without a word: it leaves routing within its lease (10 s) plus the watch.
  const absl::Time killed = absl::Now();
  spare->Kill(SIGKILL);
  testing::AwaitModels(
      *b, [](const std::set<std::string>& names) { return names.count("spare") == 0; },
      absl::Seconds(20));
  const absl::Duration gone = absl::Now() - killed;
  EXPECT_EQ(Models(server_b).count("spare"), 0u);
  EXPECT_LE(gone, kEtcdLeaseTtl + absl::Seconds(3));
  EXPECT_EQ(Generate(server_b, "spare").code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(Generate(server_b, "copy").ok());

  // A consumer stopped cleanly revokes its lease: gone at once.
  const absl::Time stopped = absl::Now();
  EXPECT_EQ(copy->Terminate(absl::Seconds(20)), 0) << copy->Ending();
  testing::AwaitModels(
      *b, [](const std::set<std::string>& names) { return names.count("copy") == 0; },
      absl::Seconds(10));
  EXPECT_LT(absl::Now() - stopped, absl::Seconds(3));
  absl::StatusOr<std::vector<EtcdKeyValue>> left = client->Range(kEtcdNodesPrefix);
  ASSERT_TRUE(left.ok());
  EXPECT_EQ(left->size(), 1u);  // the producer's
  (*etcd)->Terminate(absl::Seconds(10));
}

TEST(EtcdRegistryTest, ABadRegistryAddressIsRefusedAtStart) {
  const std::string env = std::string("SCD_CLUSTER_SECRET=") + testing::kTestClusterSecret + " ";
  const testing::CommandResult node = testing::RunCommand(
      env + Bin("scd-consumer") + " --model " + testing::ModelDir("stories260k") +
      " --registry etcd://nowhere");
  EXPECT_EQ(node.exit_code, 1);
  EXPECT_THAT(node.err, ::testing::HasSubstr("expected etcd://HOST:PORT"));
  const testing::CommandResult coordinator =
      testing::RunCommand(env + Bin("scd-coordinator") + " --registry zookeeper://x:1");
  EXPECT_EQ(coordinator.exit_code, 1);
  EXPECT_THAT(coordinator.err, ::testing::HasSubstr("expected etcd://HOST:PORT"));
}

}  // namespace
}  // namespace scd
