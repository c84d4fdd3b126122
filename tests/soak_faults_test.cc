// The soak's fault schedule (bench/soak_faults.h): the first cycle runs every kind and kills and
// freezes every role; later cycles kill each node in turn (so each also lives long), freeze a
// replica of a replicated target twice (its streams must move), freeze the producer (its transfers
// fall back) and kill a coordinator every third cycle besides (its streams resume); a
// replica's or coordinator's fault may go to the one holding streams; a fault's outcome holds
// only within its bounds.
#include "bench/soak_faults.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <vector>

namespace scd::bench {
namespace {

std::vector<SoakNode> Nodes() {
  std::vector<SoakNode> nodes;
  auto add = [&](SoakRole role, const std::string& name, const std::string& model = "") {
    SoakNode& n = nodes.emplace_back();
    n.role = role;
    n.name = name;
    n.model = model;
  };
  add(SoakRole::kEtcd, "etcd");
  add(SoakRole::kCoordinator, "coordinator-0");
  add(SoakRole::kCoordinator, "coordinator-1");
  add(SoakRole::kProducer, "producer");
  // Two replicas of fables and one of xs, as the soak's deployment.
  for (int i = 0; i < 3; ++i) {
    add(SoakRole::kConsumer, "consumer-" + std::to_string(i), i < 2 ? "fables" : "xs");
  }
  return nodes;
}

TEST(SoakFaultsTest, TheFirstCycleRunsEveryKindAndKillsAndFreezesEveryRole) {
  const std::vector<SoakNode> nodes = Nodes();
  std::set<FaultKind> kinds;
  std::set<SoakRole> killed, frozen;
  for (const SoakFault& f : SoakFaultCycle(nodes, 0)) {
    kinds.insert(f.kind);
    if (f.kind == FaultKind::kKill) killed.insert(nodes[static_cast<size_t>(f.node)].role);
    if (f.kind == FaultKind::kFreeze) frozen.insert(nodes[static_cast<size_t>(f.node)].role);
    if (f.kind == FaultKind::kEtcd) {
      EXPECT_EQ(nodes[static_cast<size_t>(f.node)].role, SoakRole::kEtcd);
    }
    if (f.kind == FaultKind::kFlap) {
      EXPECT_EQ(f.node, -1);
    }
    if (f.kind == FaultKind::kReplace) {
      EXPECT_EQ(nodes[static_cast<size_t>(f.node)].role, SoakRole::kCoordinator);
    }
  }
  EXPECT_EQ(kinds.size(), std::size(kAllFaultKinds));
  const std::set<SoakRole> roles = {SoakRole::kConsumer, SoakRole::kProducer,
                                    SoakRole::kCoordinator};
  EXPECT_EQ(killed, roles);
  EXPECT_EQ(frozen, roles);
}

TEST(SoakFaultsTest, LaterCyclesKillEachNodeInTurn) {
  const std::vector<SoakNode> nodes = Nodes();
  std::map<int, int> kills;
  int replaced = 0;
  for (int cycle = 1; cycle <= 6; ++cycle) {
    for (const SoakFault& f : SoakFaultCycle(nodes, cycle)) {
      if (f.kind == FaultKind::kKill) ++kills[f.node];
      replaced += f.kind == FaultKind::kReplace;
    }
  }
  EXPECT_EQ(kills.size(), 6u);  // every node but etcd, once each in six cycles
  for (const auto& [node, n] : kills) {
    // A coordinator also every third cycle besides its turn (cycles 1 and 4: each once more).
    const bool coordinator = nodes[static_cast<size_t>(node)].role == SoakRole::kCoordinator;
    EXPECT_EQ(n, coordinator ? 2 : 1) << nodes[static_cast<size_t>(node)].name;
  }
  EXPECT_EQ(replaced, 2);
}

// A replica's or a coordinator's kill or freeze may go to whichever of its kind holds streams
// when it comes (routing sends most of a target's streams to one replica); the producer's and
// the unreplicated xs consumer's go where planned.
TEST(SoakFaultsTest, AReplicasOrCoordinatorsFaultMayGoToTheOneHoldingStreams) {
  const std::vector<SoakNode> nodes = Nodes();
  int replica_faults = 0, coordinator_faults = 0;
  for (int cycle = 0; cycle <= 6; ++cycle) {
    for (const SoakFault& f : SoakFaultCycle(nodes, cycle)) {
      if (f.kind != FaultKind::kKill && f.kind != FaultKind::kFreeze) {
        EXPECT_TRUE(f.either.empty());
        continue;
      }
      const SoakNode& n = nodes[static_cast<size_t>(f.node)];
      if (n.role == SoakRole::kCoordinator) {
        EXPECT_EQ(f.either, (std::vector<int>{1, 2}));
        ++coordinator_faults;
      } else if (n.model == "fables") {
        EXPECT_EQ(f.either, (std::vector<int>{4, 5}));
        ++replica_faults;
      } else {
        EXPECT_TRUE(f.either.empty()) << n.name;
      }
    }
  }
  EXPECT_GT(replica_faults, 0);
  EXPECT_GT(coordinator_faults, 0);
}

TEST(SoakFaultsTest, EveryLaterCycleFreezesAReplicaWhoseStreamsCanMove) {
  const std::vector<SoakNode> nodes = Nodes();
  std::map<std::string, int> frozen;  // fables replicas frozen beyond the turn-taking freeze
  for (int cycle = 1; cycle <= 4; ++cycle) {
    const std::vector<SoakFault> faults = SoakFaultCycle(nodes, cycle);
    int replica_freezes = 0;
    for (const SoakFault& f : faults) {
      const SoakNode& n = nodes[static_cast<size_t>(std::max(f.node, 0))];
      if (f.kind == FaultKind::kFreeze && n.model == "fables") {
        ++replica_freezes;
        ++frozen[n.name];
      }
    }
    EXPECT_GE(replica_freezes, 2) << "cycle " << cycle;
  }
  EXPECT_EQ(frozen.size(), 2u) << "both replicas in turn";
}

// The link cut lengthens every cycle, so fewer fit in the soak's time: with it, a later cycle
// freezes a replica a third time, never two replica freezes in a row (streams gather between).
TEST(SoakFaultsTest, WithTheLinkCutALaterCycleFreezesAReplicaThreeTimesApart) {
  const std::vector<SoakNode> nodes = Nodes();
  for (int cycle = 1; cycle <= 4; ++cycle) {
    const std::vector<SoakFault> faults = SoakFaultCycle(nodes, cycle, true);
    std::vector<size_t> at;
    for (size_t i = 0; i < faults.size(); ++i) {
      const SoakNode& n = nodes[static_cast<size_t>(std::max(faults[i].node, 0))];
      if (faults[i].kind == FaultKind::kFreeze && n.model == "fables") at.push_back(i);
    }
    EXPECT_GE(at.size(), 3u) << "cycle " << cycle;
    for (size_t k = 1; k < at.size(); ++k) EXPECT_GT(at[k], at[k - 1] + 1) << "cycle " << cycle;
  }
}

// Fallbacks need the producer to stop mid-transfer often: every later cycle freezes it besides
// the turn that kills and freezes every node (frozen: it still lives long enough for its memory's
// growth to be measured).
TEST(SoakFaultsTest, EveryLaterCycleFreezesTheProducer) {
  const std::vector<SoakNode> nodes = Nodes();
  for (int cycle = 1; cycle <= 6; ++cycle) {
    int freezes = 0;
    for (const SoakFault& f : SoakFaultCycle(nodes, cycle)) {
      if (f.node >= 0 && nodes[static_cast<size_t>(f.node)].role == SoakRole::kProducer) {
        freezes += f.kind == FaultKind::kFreeze;
        EXPECT_TRUE(f.either.empty());  // the only producer: nowhere else to go
      }
    }
    EXPECT_GE(freezes, 1) << "cycle " << cycle;
  }
}

// With the producer in a namespace of its own, every cycle also cuts its link, once, right
// after the flap; without one, never.
TEST(SoakFaultsTest, AProducerWithALinkOfItsOwnHasItCutEveryCycle) {
  const std::vector<SoakNode> nodes = Nodes();
  for (int cycle = 0; cycle <= 6; ++cycle) {
    const std::vector<SoakFault> with = SoakFaultCycle(nodes, cycle, true);
    const std::vector<SoakFault> without = SoakFaultCycle(nodes, cycle, false);
    // The cut, and in a later cycle a third replica freeze (the test above).
    EXPECT_EQ(with.size(), without.size() + (cycle > 0 ? 2 : 1)) << "cycle " << cycle;
    int cuts = 0;
    for (size_t i = 0; i < with.size(); ++i) {
      if (with[i].kind != FaultKind::kLinkDown) continue;
      ++cuts;
      EXPECT_EQ(nodes[static_cast<size_t>(with[i].node)].role, SoakRole::kProducer);
      ASSERT_GT(i, 0u);
      EXPECT_EQ(with[i - 1].kind, FaultKind::kFlap) << "cycle " << cycle;
    }
    EXPECT_EQ(cuts, 1) << "cycle " << cycle;
    for (const SoakFault& f : without) EXPECT_NE(f.kind, FaultKind::kLinkDown);
  }
}

TEST(SoakFaultsTest, AnOutcomeHoldsOnlyWithinItsBounds) {
  FaultOutcome f;
  f.recovered = absl::Now();
  f.recovery_s = 0.5;
  EXPECT_TRUE(f.ok());
  f.recovery_s = 5.5;
  EXPECT_FALSE(f.ok());  // served again past 5 s
  f.recovery_s = 0.5;
  f.out_of_routing_s = 12;
  f.out_of_routing_bound_s = 13;
  EXPECT_TRUE(f.ok());
  f.out_of_routing_s = 14;
  EXPECT_FALSE(f.ok());  // routed to past its lease
  f.out_of_routing_s = -1;
  f.recovered = absl::InfinitePast();
  EXPECT_FALSE(f.ok());  // never served again
  f.recovered = absl::Now();
  f.error = "did not come back";
  EXPECT_FALSE(f.ok());
}

}  // namespace
}  // namespace scd::bench
