// Fast ejection's advice between coordinators (coordinator/node_ejection.h,
// coordinator/etcd_node_watch.h), in one process on a real etcd: a consumer node registered in
// etcd (its lease alive throughout) and two coordinators watching it, each reaching the consumer
// through a FreezableProxy of its own (tests/freezable_proxy.h), so one coordinator's link can go
// silent while the other's works.
//   - A's link freezes: A ejects the consumer on its failed call and tells B; B probes it over
//     its own link, the probe passes, and B keeps routing to it (A keeps it out: its probes fail).
//   - Both links freeze: A's advice makes B probe at once; B's probe fails and B ejects the node
//     without a call of its own, although the node's etcd lease lives on.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/change_notice.h"
#include "base/host_port.h"
#include "consumer/consumer_node.h"
#include "coordinator/coordinator_node.h"
#include "proto/inference_client.h"
#include "proto/registry_client.h"
#include "tests/etcd_server.h"
#include "tests/freezable_proxy.h"
#include "tests/test_files.h"

namespace scd {
namespace {

constexpr char kSecret[] = "advice-test-cluster-secret-0123";

class EjectionAdviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto etcd = testing::EtcdServer::Start(dir_.path());
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = *std::move(etcd);
    consumer::ConsumerNodeOptions options;
    options.model.model_dir = testing::ModelDir("stories260k");
    options.model.name = "tales";
    options.cluster_secret = kSecret;
    options.coordinator = etcd_->registry();
    auto node = consumer::ConsumerNode::Start(options);
    ASSERT_TRUE(node.ok()) << node.status();
    consumer_ = *std::move(node);
    absl::StatusOr<HostPort> control = ParseHostPort(consumer_->control_address());
    ASSERT_TRUE(control.ok()) << control.status();
    proxy_a_ = std::make_unique<testing::FreezableProxy>(control->port);
    proxy_b_ = std::make_unique<testing::FreezableProxy>(control->port);
    a_ = StartCoordinator(*proxy_a_);
    b_ = StartCoordinator(*proxy_b_);
    ASSERT_NE(a_, nullptr);
    ASSERT_NE(b_, nullptr);
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    ASSERT_TRUE(a_->registry().AwaitSize(1, deadline));
    ASSERT_TRUE(b_->registry().AwaitSize(1, deadline));
    const std::vector<std::string> ids = b_->registry().ExternalNodeIds();
    ASSERT_EQ(ids.size(), 1u);
    node_id_ = ids[0];
    // Both routes work, and each coordinator's channel is connected through its proxy.
    ASSERT_TRUE(Generate(*a_).ok());
    ASSERT_TRUE(Generate(*b_).ok());
  }

  // A coordinator on etcd whose calls to the consumer go through `proxy`.
  std::unique_ptr<coordinator::CoordinatorNode> StartCoordinator(
      const testing::FreezableProxy& proxy) {
    coordinator::CoordinatorNodeOptions options;
    options.cluster_secret = kSecret;
    options.registry_address = etcd_->registry();
    auto node = coordinator::CoordinatorNode::Start(options);
    EXPECT_TRUE(node.ok()) << node.status();
    if (!node.ok()) return nullptr;
    (*node)->UseChannel(consumer_->control_address(),
                        coordinator::CoordinatorInferenceService::NodeChannel(proxy.address()));
    return *std::move(node);
  }

  static absl::Status Generate(const coordinator::CoordinatorNode& via) {
    v1::GenerateRequest request;
    request.set_prompt("Once upon a time");
    request.add_targets("tales");
    request.set_max_tokens(4);
    bool finished = false;
    absl::Status status =
        StreamGenerate(via.address(), request, absl::Seconds(30), [&](const v1::GenerateEvent& e) {
          if (e.has_finished()) finished = true;
        });
    if (status.ok() && !finished) return absl::InternalError("no Finished event");
    return status;
  }

  testing::TempDir dir_;
  std::unique_ptr<testing::EtcdServer> etcd_;
  std::unique_ptr<consumer::ConsumerNode> consumer_;
  std::unique_ptr<testing::FreezableProxy> proxy_a_, proxy_b_;
  std::unique_ptr<coordinator::CoordinatorNode> a_, b_;  // last: stop first
  std::string node_id_;
};

TEST_F(EjectionAdviceTest, OneCoordinatorsBadLinkEjectsTheNodeForItselfOnly) {
  proxy_a_->Freeze();
  EXPECT_FALSE(Generate(*a_).ok()) << "A's link to its only consumer is silent";
  ASSERT_TRUE(a_->registry().Ejected(node_id_)) << "A's failed call ejects the consumer";

  coordinator::NodeRegistry& b = b_->registry();
  ASSERT_TRUE(
      AwaitChange([&] { return b.advice_counts().cleared + b.advice_counts().confirmed > 0; },
                  absl::Now() + absl::Seconds(20)))
      << "B heard no advice, or never probed";
  // A's advice (put from A's publisher thread; B heard it, so it is there), under its lease.
  absl::StatusOr<std::vector<EtcdKeyValue>> advice = etcd_->client().Range(kEtcdAdvicePrefix);
  ASSERT_TRUE(advice.ok()) << advice.status();
  ASSERT_EQ(advice->size(), 1u);
  EXPECT_TRUE(absl::StartsWith((*advice)[0].key,
                               absl::StrCat(kEtcdAdvicePrefix, node_id_, "/coordinator-")))
      << (*advice)[0].key;
  EXPECT_EQ(b.advice_counts().heard, 1u);
  EXPECT_EQ(b.advice_counts().cleared, 1u) << "B's own probe passed";
  EXPECT_EQ(b.advice_counts().confirmed, 0u);
  EXPECT_FALSE(b.Ejected(node_id_));
  EXPECT_TRUE(Generate(*b_).ok()) << "B keeps routing to the consumer";
  EXPECT_TRUE(a_->registry().Ejected(node_id_)) << "A's probes fail over its silent link";
}

TEST_F(EjectionAdviceTest, AFrozenNodeLeavesTheOtherCoordinatorOnItsOwnFailedProbe) {
  proxy_a_->Freeze();
  proxy_b_->Freeze();
  EXPECT_FALSE(Generate(*a_).ok());
  ASSERT_TRUE(a_->registry().Ejected(node_id_));
  const absl::Time a_out = absl::Now();
  coordinator::NodeRegistry& b = b_->registry();
  ASSERT_TRUE(AwaitChange([&] { return b.Ejected(node_id_); }, absl::Now() + absl::Seconds(20)))
      << "B never ejected the frozen node";
  // B made no call to it: only A's advice and B's own failed probe put it out, while the node's
  // etcd lease (its process runs) would have kept it in.
  EXPECT_EQ(b.advice_counts().heard, 1u);
  EXPECT_EQ(b.advice_counts().confirmed, 1u);
  EXPECT_EQ(b.advice_counts().cleared, 0u);
  EXPECT_EQ(b.ExternalNodeIds().size(), 1u) << "still registered: the lease lives";
  std::printf("B ejected the frozen node %.0f ms after A did\n",
              absl::ToDoubleMilliseconds(absl::Now() - a_out));
  const absl::Status refused = Generate(*b_);
  EXPECT_TRUE(absl::IsUnavailable(refused)) << refused;
}

}  // namespace
}  // namespace scd
