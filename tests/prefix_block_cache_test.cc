#include "base/prefix_block_cache.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "base/prefix_hash.h"
#include "base/simulated_clock.h"

namespace scd {
namespace {

struct Bytes {
  int64_t size = 0;
  int id = 0;
  int64_t bytes() const { return size; }
};
using Cache = PrefixBlockCache<Bytes>;

std::vector<Cache::BlockPtr> Blocks(int n, int64_t size, int first_id = 0) {
  std::vector<Cache::BlockPtr> blocks;
  for (int i = 0; i < n; ++i) blocks.push_back(std::make_shared<Bytes>(Bytes{size, first_id + i}));
  return blocks;
}

std::vector<TokenId> Range(int n, int start = 0) {
  std::vector<TokenId> ids;
  for (int i = 0; i < n; ++i) ids.push_back(start + i);
  return ids;
}

TEST(PrefixHash, ChainNamesTheWholePrefixAndTheSalt) {
  const std::vector<TokenId> a = Range(40);
  std::vector<TokenId> b = a;
  b[3] = 1000;  // differs in block 0
  const auto ca = PrefixBlockChain("", a), cb = PrefixBlockChain("", b);
  ASSERT_EQ(ca.size(), 2u);  // 40 tokens: two full blocks of 16, the rest is not hashed
  EXPECT_EQ(ca[0].size(), 32u);
  EXPECT_NE(ca[0], cb[0]);
  EXPECT_NE(ca[1], cb[1]);  // block 1's tokens are equal, its prefix is not
  // An extension shares the chain of what it extends.
  const auto longer = PrefixBlockChain("", Range(64));
  ASSERT_EQ(longer.size(), 4u);
  EXPECT_EQ(longer[0], ca[0]);
  EXPECT_EQ(longer[1], ca[1]);
  // Salts never share a block, not even the empty salt with a salt.
  const auto salted = PrefixBlockChain("tenant-a", a);
  EXPECT_NE(salted[0], ca[0]);
  EXPECT_NE(PrefixBlockChain("tenant-b", a)[0], salted[0]);
  EXPECT_EQ(PrefixBlockChain("tenant-a", a), salted);  // deterministic
  // Scopes separate models; routing keys are the hash's first 8 bytes.
  EXPECT_NE(ScopedBlockKey("model-1", ca[0]), ScopedBlockKey("model-2", ca[0]));
  uint64_t expect = 0;
  for (int i = 7; i >= 0; --i) expect = (expect << 8) | static_cast<unsigned char>(ca[0][i]);
  EXPECT_EQ(RoutingKey(ca[0]), expect);
  EXPECT_TRUE(PrefixBlockChain("", Range(15)).empty());
}

TEST(PrefixBlockCache, LookupFindsTheLongestRunFromTheStart) {
  Cache cache(1 << 20, 16);
  const auto keys = PrefixBlockChain("", Range(64));
  EXPECT_EQ(cache.Insert(keys, RoutingKeys(keys), 0, Blocks(3, 10)), 3u);
  EXPECT_EQ(cache.Lookup(keys, keys.size()).size(), 3u);
  EXPECT_EQ(cache.Lookup(keys, 2).size(), 2u);
  // A block without its parent is never inserted.
  Cache other(1 << 20, 16);
  EXPECT_EQ(other.Insert(keys, RoutingKeys(keys), 2, Blocks(2, 10)), 0u);
  EXPECT_TRUE(other.Lookup(keys, 4).empty());
  // Another prompt sharing block 0 only.
  std::vector<TokenId> fork = Range(64);
  fork[20] = 999;
  const auto fkeys = PrefixBlockChain("", fork);
  EXPECT_EQ(cache.Lookup(fkeys, 4).size(), 1u);
  EXPECT_EQ(cache.Insert(fkeys, RoutingKeys(fkeys), 1, Blocks(3, 10)), 3u);
  EXPECT_EQ(cache.Counters().entries, 6u);
  EXPECT_EQ(cache.Counters().bytes, 60u);
  EXPECT_EQ(cache.RoutingKeys(1).front(), RoutingKey(fkeys[3]));  // most recent first
}

TEST(PrefixBlockCache, EvictsLeastRecentlyUsedTrailingBlocksOnly) {
  Cache cache(50, 16);
  const auto a = PrefixBlockChain("a", Range(64));
  const auto b = PrefixBlockChain("b", Range(64));
  const auto c = PrefixBlockChain("c", Range(64));
  cache.Insert(a, RoutingKeys(a), 0, Blocks(3, 10));
  cache.Insert(b, RoutingKeys(b), 0, Blocks(2, 10));
  EXPECT_EQ(cache.Counters().evictions, 0u);
  cache.Lookup(b, 4);                                 // b is now more recently used than a
  cache.Insert(c, RoutingKeys(c), 0, Blocks(2, 10));  // 70 bytes: two blocks go
  const PrefixCacheCounters counters = cache.Counters();
  EXPECT_EQ(counters.evictions, 2u);
  EXPECT_EQ(counters.bytes, 50u);
  // The least recently used leaf was a's last block; once it went, a's middle block became the
  // least recently used leaf. A chain never loses its middle: what is held is a run from its start.
  EXPECT_EQ(cache.Lookup(a, 4).size(), 1u);
  EXPECT_TRUE(cache.Contains(a[0]));
  EXPECT_FALSE(cache.Contains(a[1]));
  EXPECT_FALSE(cache.Contains(a[2]));
  EXPECT_EQ(cache.Lookup(b, 4).size(), 2u);
  EXPECT_EQ(cache.Lookup(c, 4).size(), 2u);
}

TEST(PrefixBlockCache, ReaderKeepsAnEvictedBlockAlive) {
  Cache cache(10, 16);
  const auto a = PrefixBlockChain("", Range(16));
  cache.Insert(a, RoutingKeys(a), 0, Blocks(1, 10, 7));
  std::vector<Cache::BlockPtr> found = cache.Lookup(a, 1);
  ASSERT_EQ(found.size(), 1u);
  const auto b = PrefixBlockChain("x", Range(16));
  cache.Insert(b, RoutingKeys(b), 0, Blocks(1, 10));
  EXPECT_FALSE(cache.Contains(a[0]));
  EXPECT_EQ(found[0]->id, 7);  // still readable
}

// Update grows a held block under the lock (concurrent growers never lose each other's part),
// recounts its bytes, evicts to the budget, and leaves readers' old copies as they were.
TEST(PrefixBlockCache, UpdateGrowsABlockAndKeepsTheBudget) {
  Cache cache(/*budget_bytes=*/1000, 16);
  const auto keys = PrefixBlockChain("", Range(48));  // 3 blocks
  ASSERT_EQ(cache.Insert(keys, {}, 0, Blocks(3, 100)), 3u);
  const Cache::BlockPtr before = cache.Lookup(keys, 1)[0];
  EXPECT_FALSE(cache.Update("absent", [](const Bytes& b) { return std::make_shared<Bytes>(b); }));
  EXPECT_FALSE(cache.Update(keys[0], [](const Bytes&) { return Cache::BlockPtr(); }));  // kept
  // Eight threads each add 10 bytes to block 0, 50 times.
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i) {
        cache.Update(keys[0], [](const Bytes& b) {
          return std::make_shared<Bytes>(Bytes{b.size + 10, b.id});
        });
      }
    });
  }
  for (std::thread& t : threads) t.join();
  // 100 + 8 * 50 * 10 = 4100 bytes in block 0 alone: over the budget of 1000, so the leaves go,
  // least recently used first (blocks 2, 1), then block 0 itself.
  EXPECT_EQ(before->size, 100);  // the reader's copy did not change
  const PrefixCacheCounters c = cache.Counters();
  EXPECT_EQ(c.evictions, 3u);
  EXPECT_EQ(c.entries, 0u);
  EXPECT_EQ(c.bytes, 0u);

  Cache roomy(/*budget_bytes=*/100000, 16);
  ASSERT_EQ(roomy.Insert(keys, {}, 0, Blocks(3, 100)), 3u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(roomy.Update(keys[1], [](const Bytes& b) {
      return std::make_shared<Bytes>(Bytes{b.size + 10, b.id});
    }));
  }
  EXPECT_EQ(roomy.Lookup(keys, 3)[1]->size, 150);
  EXPECT_EQ(roomy.Counters().bytes, 350u);
}

// The waits below are on a simulated clock: a test knows a request is parked on its claim wait
// when the clock holds its deadline (AwaitPending), and ends a wait by advancing the clock.
TEST(PrefixBlockCache, ConcurrentRequestsForOnePrefixComputeItOnce) {
  SimulatedClock clock;
  Cache cache(1 << 20, 16, &clock);
  const auto keys = PrefixBlockChain("", Range(64));
  std::atomic<int> computed{0};
  auto request = [&] {
    for (;;) {
      const size_t held = cache.Lookup(keys, keys.size()).size();
      if (held == keys.size()) return;
      auto claim =
          cache.ClaimOrWait(keys, held, keys.size(), clock.Now() + absl::Seconds(10), nullptr);
      if (!claim.has_value()) continue;  // someone else computed: look again
      ++computed;
      cache.Insert(keys, RoutingKeys(keys), held, Blocks(static_cast<int>(keys.size() - held), 1));
      return;
    }
  };
  // One request claims the prefix; three more arrive while it computes and wait for it.
  std::vector<std::thread> threads;
  {
    auto first = cache.ClaimOrWait(keys, 0, keys.size(), clock.Now(), nullptr);
    ASSERT_TRUE(first.has_value());
    for (int i = 0; i < 3; ++i) threads.emplace_back(request);
    clock.AwaitPending(3);
    EXPECT_EQ(cache.waits(), 3u);
    cache.Insert(keys, RoutingKeys(keys), 0, Blocks(static_cast<int>(keys.size()), 1));
  }  // the claim ends: they look again and find it
  for (auto& t : threads) t.join();
  EXPECT_EQ(computed.load(), 0);  // computed once: by the first, none of the three
  EXPECT_EQ(clock.pending(), 0u);
}

TEST(PrefixBlockCache, AFailedClaimLeavesNothingAndLetsTheWaiterCompute) {
  SimulatedClock clock;
  Cache cache(1 << 20, 16, &clock);
  const auto keys = PrefixBlockChain("", Range(32));
  std::atomic<bool> waiter_claimed{false};
  std::thread waiter;
  {
    auto first = cache.ClaimOrWait(keys, 0, 2, clock.Now() + absl::Seconds(1), nullptr);
    ASSERT_TRUE(first.has_value());
    waiter = std::thread([&] {
      EXPECT_FALSE(cache.ClaimOrWait(keys, 0, 2, clock.Now() + absl::Seconds(10), nullptr));
      auto second = cache.ClaimOrWait(keys, 0, 2, clock.Now() + absl::Seconds(10), nullptr);
      waiter_claimed = second.has_value();
    });
    clock.AwaitPending(1);  // the waiter waits for `first`
    // `first` fails: no Insert.
  }
  waiter.join();
  EXPECT_TRUE(waiter_claimed.load());
  EXPECT_EQ(cache.Counters().entries, 0u);
}

TEST(PrefixBlockCache, WaitEndsAtItsDeadlineOrCancel) {
  SimulatedClock clock;
  Cache cache(1 << 20, 16, &clock);
  const auto keys = PrefixBlockChain("", Range(16));
  auto held = cache.ClaimOrWait(keys, 0, 1, clock.Now(), nullptr);
  ASSERT_TRUE(held.has_value());
  // The deadline ends the wait: not a microsecond before it.
  std::atomic<bool> returned{false};
  std::thread waiter([&] {
    EXPECT_FALSE(cache.ClaimOrWait(keys, 0, 1, clock.Now() + absl::Milliseconds(100), nullptr));
    returned = true;
  });
  clock.AwaitPending(1);
  clock.Advance(absl::Milliseconds(99));
  EXPECT_FALSE(returned.load());
  clock.Advance(absl::Milliseconds(1));
  waiter.join();
  // Cancelled before: no wait at all (the clock holds no deadline for it).
  Cancellation cancelled;
  cancelled.Cancel(absl::CancelledError("gone"));
  EXPECT_FALSE(cache.ClaimOrWait(keys, 0, 1, clock.Now() + absl::Seconds(30), &cancelled));
  EXPECT_EQ(clock.pending(), 0u);
  // A cancel during the wait ends it (its callback wakes the wait: nothing polls), the clock
  // standing still.
  Cancellation later;
  const absl::Time before = clock.Now();
  std::thread cancelled_waiter([&] {
    EXPECT_FALSE(cache.ClaimOrWait(keys, 0, 1, clock.Now() + absl::Seconds(30), &later));
  });
  clock.AwaitPending(1);
  later.Cancel(absl::CancelledError("gone"));
  cancelled_waiter.join();
  EXPECT_EQ(clock.Now(), before);
  EXPECT_EQ(clock.pending(), 0u);
}

TEST(PrefixBlockCache, CountsHitsAndMisses) {
  Cache cache(1 << 20, 16);
  cache.Record(32, 64);
  cache.Record(0, 64);
  const PrefixCacheCounters c = cache.Counters();
  EXPECT_EQ(c.hits, 1u);
  EXPECT_EQ(c.misses, 1u);
  EXPECT_EQ(c.hit_tokens, 32u);
  EXPECT_EQ(c.lookup_tokens, 128u);
  EXPECT_EQ(c.block_tokens, 16);
}

}  // namespace
}  // namespace scd
