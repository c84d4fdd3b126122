// The cluster simulator's nodes (bench/sim_nodes.h): what they register is what the coordinator's
// own validation accepts, a consumer's artifact carrying the pool pair's codes as its frontier's
// point; their prefix caches (the real PrefixBlockCache) serve a group's shared blocks to the next
// request of the group, capped before the prompt's last token, and a consumer's per mode.
#include "bench/sim_nodes.h"

#include <gtest/gtest.h>

#include "coordinator/registered_node.h"
#include "proto/frontier_proto.h"

namespace scd::bench::sim {
namespace {

SimConsumerPool Pool() {
  SimConsumerPool c;
  c.name = "fables";
  c.producer = "base";
  c.code_bytes_per_token = 384;
  c.code_kl = 0.05;
  c.layers = 6;
  c.costs.capacity = 16;
  c.costs.kv_budget_bytes = 1 << 24;
  c.costs.kv_bytes_per_token = 6144;
  c.costs.rebuild = {100, 28};
  return c;
}

TEST(SimNodesTest, WhatTheyRegisterTheCoordinatorAccepts) {
  SimProducerPool p;
  p.name = "base";
  EXPECT_TRUE(coordinator::ValidateRegistration(ProducerInfo(p, "base-0")).ok());
  const v1::RegisterRequest c = ConsumerInfo(Pool(), "fables-0");
  ASSERT_TRUE(coordinator::ValidateRegistration(c).ok());
  EXPECT_EQ(c.capacity(), 16u);
  ASSERT_EQ(c.artifacts_size(), 1);
  EXPECT_EQ(c.artifacts(0).producer_fingerprint(),
            ProducerInfo(p, "base-0").models(0).fingerprint());
  absl::StatusOr<Frontier> frontier = FrontierFromEntry(c.artifacts(0));
  ASSERT_TRUE(frontier.ok()) << frontier.status();
  ASSERT_EQ(frontier->points.size(), 1u);
  EXPECT_EQ(frontier->points[0].bytes_per_token, 384);
  EXPECT_EQ(frontier->points[0].rank_k.size(), 6u);
  EXPECT_EQ(frontier->points[0].rebuild_us_per_token, 28);
  SimConsumerPool local = Pool();
  local.producer.clear();
  EXPECT_EQ(ConsumerInfo(local, "x").artifacts_size(), 0);
}

Req Request(uint64_t id, int64_t prompt, int64_t shared_blocks) {
  Req r;
  r.r.id = id;
  r.r.prompt_tokens = prompt;
  r.r.tenant = 1;
  r.r.group = 2;
  r.r.shared_blocks = shared_blocks;
  for (int64_t b = 0; b < (prompt - 1) / kBlock; ++b) r.r.blocks.push_back(id * 1000 + b);
  return r;
}

TEST(SimNodesTest, ACacheServesAGroupsSharedBlocksToItsNextRequestPerMode) {
  std::unique_ptr<BlockCache> cache = CacheOf(1, 100, Clock::Real());
  ASSERT_NE(cache, nullptr);
  EXPECT_EQ(CacheOf(0, 100, Clock::Real()), nullptr);
  const Req a = Request(1, 100, 3), b = Request(2, 200, 5), c = Request(3, 33, 2);
  EXPECT_EQ(Cached(cache.get(), a, "scd"), 0);
  Keep(cache.get(), a, "scd", 100);
  EXPECT_EQ(Cached(cache.get(), b, "scd"), 3 * kBlock);  // a's three shared blocks
  EXPECT_EQ(Cached(cache.get(), b, "local"), 0);         // another mode's cache
  EXPECT_EQ(Cached(cache.get(), a, "scd"), 96);          // all of a's 6 full blocks
  // Two shared blocks of a 33-token prompt: 32 positions held, the last token still run.
  EXPECT_EQ(Cached(cache.get(), c, "scd"), 32);
  EXPECT_EQ(Cached(nullptr, a, "scd"), 0);
  // The budget bounds what it holds: 1 MiB of 1,600-byte blocks.
  for (uint64_t id = 10; id < 2000; ++id) Keep(cache.get(), Request(id, 100, 0), "", 100);
  EXPECT_LE(cache->Counters().bytes, uint64_t{1} << 20);
}

}  // namespace
}  // namespace scd::bench::sim
