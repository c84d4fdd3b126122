#include "base/tally.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace scd {
namespace {

TEST(TallyTest, CountsByNameWithUnderscoredKeys) {
  Tally tally;
  EXPECT_EQ(tally.Get("completed"), 0u);
  tally.Add("completed");
  tally.Add("peer lost", 2);
  EXPECT_EQ(tally.Get("completed"), 1u);
  EXPECT_EQ(tally.Get("peer_lost"), 2u);
  EXPECT_EQ(tally.Get("peer lost"), 2u);
  EXPECT_EQ(tally.Snapshot(),
            (std::map<std::string, uint64_t>{{"completed", 1}, {"peer_lost", 2}}));
}

TEST(TallyTest, ConcurrentAddsAreAllCounted) {
  Tally tally;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) tally.Add(i % 2 ? "odd" : "even");
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(tally.Get("odd"), 20000u);
  EXPECT_EQ(tally.Get("even"), 20000u);
}

}  // namespace
}  // namespace scd
