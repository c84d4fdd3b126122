// Fast ejection's advice between coordinators (coordinator/node_ejection.h,
// coordinator/etcd_node_watch.h) on tests/two_coordinators.h's deployment: two coordinators on one
// etcd, each reaching the one consumer through a proxy of its own.
//   - A's link freezes: A ejects the consumer on its failed call and tells B; B probes it over
//     its own link, the probe passes, and B keeps routing to it (A keeps it out: its probes fail).
//   - Both links freeze: A's advice makes B probe at once; B's probe fails and B ejects the node
//     without a call of its own, although the node's etcd lease lives on.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/change_notice.h"
#include "proto/registry_client.h"
#include "tests/two_coordinators.h"

namespace scd {
namespace {

using EjectionAdviceTest = TwoCoordinatorsTest;

TEST_F(EjectionAdviceTest, OneCoordinatorsBadLinkEjectsTheNodeForItselfOnly) {
  proxy_a_->Freeze();
  EXPECT_FALSE(Generate(*a_).ok()) << "A's link to its only consumer is silent";
  ASSERT_TRUE(a_->registry().Ejected(node_id_)) << "A's failed call ejects the consumer";

  coordinator::NodeRegistry& b = b_->registry();
  ASSERT_TRUE(AwaitChange(
      [&] { return b.ejection_counts().advice_cleared + b.ejection_counts().advice_confirmed > 0; },
      absl::Now() + absl::Seconds(20)))
      << "B heard no advice, or never probed";
  // A's advice (put from A's publisher thread; B heard it, so it is there), under its lease.
  absl::StatusOr<std::vector<EtcdKeyValue>> advice = etcd_->client().Range(kEtcdAdvicePrefix);
  ASSERT_TRUE(advice.ok()) << advice.status();
  ASSERT_EQ(advice->size(), 1u);
  EXPECT_TRUE(absl::StartsWith((*advice)[0].key,
                               absl::StrCat(kEtcdAdvicePrefix, node_id_, "/coordinator-")))
      << (*advice)[0].key;
  EXPECT_EQ(b.ejection_counts().advice_heard, 1u);
  EXPECT_EQ(b.ejection_counts().advice_cleared, 1u) << "B's own probe passed";
  EXPECT_EQ(b.ejection_counts().advice_confirmed, 0u);
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
  EXPECT_EQ(b.ejection_counts().advice_heard, 1u);
  EXPECT_EQ(b.ejection_counts().advice_confirmed, 1u);
  EXPECT_EQ(b.ejection_counts().advice_cleared, 0u);
  EXPECT_EQ(b.ExternalNodeIds().size(), 1u) << "still registered: the lease lives";
  std::printf("B ejected the frozen node %.0f ms after A did\n",
              absl::ToDoubleMilliseconds(absl::Now() - a_out));
  const absl::Status refused = Generate(*b_);
  EXPECT_TRUE(absl::IsUnavailable(refused)) << refused;
}

}  // namespace
}  // namespace scd
