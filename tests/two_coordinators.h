// TwoCoordinatorsTest: a fixture for what happens between coordinators, in one process on a real
// etcd (tests/etcd_server.h): a consumer node "tales" (stories260k, local prefill) registered in
// etcd, its lease alive throughout, and two coordinators watching it, each reaching the consumer
// through a FreezableProxy of its own (tests/freezable_proxy.h), so one coordinator's link can go
// silent while the other's works. SetUp leaves both routing to the consumer.
#ifndef SCD_TESTS_TWO_COORDINATORS_H_
#define SCD_TESTS_TWO_COORDINATORS_H_

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "base/host_port.h"
#include "consumer/consumer_node.h"
#include "coordinator/coordinator_node.h"
#include "proto/inference_client.h"
#include "tests/etcd_server.h"
#include "tests/freezable_proxy.h"
#include "tests/test_files.h"

namespace scd {

inline constexpr char kTwoCoordinatorsSecret[] = "two-coordinators-test-secret-0123";

class TwoCoordinatorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto etcd = testing::EtcdServer::Start(dir_.path());
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = *std::move(etcd);
    consumer::ConsumerNodeOptions options;
    options.model.model_dir = testing::ModelDir("stories260k");
    options.model.name = "tales";
    options.cluster_secret = kTwoCoordinatorsSecret;
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
    options.cluster_secret = kTwoCoordinatorsSecret;
    options.registry_address = etcd_->registry();
    auto node = coordinator::CoordinatorNode::Start(options);
    EXPECT_TRUE(node.ok()) << node.status();
    if (!node.ok()) return nullptr;
    (*node)->UseChannel(consumer_->control_address(),
                        coordinator::CoordinatorInferenceService::NodeChannel(proxy.address()));
    return *std::move(node);
  }

  static v1::GenerateRequest Request(uint32_t max_tokens = 4) {
    v1::GenerateRequest request;
    request.set_prompt("Once upon a time");
    request.add_targets("tales");
    request.set_max_tokens(max_tokens);
    return request;
  }

  static absl::Status Generate(const coordinator::CoordinatorNode& via) {
    const v1::GenerateRequest request = Request();
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

}  // namespace scd

#endif  // SCD_TESTS_TWO_COORDINATORS_H_
