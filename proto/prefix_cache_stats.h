// A node's prefix cache (base/prefix_block_cache.h) as scd.v1 reports it: counters in NodeStats,
// held blocks in heartbeats.
// Thread-safety: stateless.
#ifndef SCD_PROTO_PREFIX_CACHE_STATS_H_
#define SCD_PROTO_PREFIX_CACHE_STATS_H_

#include "base/prefix_block_cache.h"
#include "proto/registry_client.h"
#include "scd/v1/control.pb.h"
#include "scd/v1/registry.pb.h"

namespace scd {

inline void SetPrefixCacheStats(const PrefixCacheCounters& c, v1::NodeStats* stats) {
  v1::PrefixCacheStats* p = stats->mutable_prefix_cache();
  p->set_entries(c.entries);
  p->set_bytes(c.bytes);
  p->set_budget_bytes(c.budget_bytes);
  p->set_hits(c.hits);
  p->set_misses(c.misses);
  p->set_evictions(c.evictions);
  p->set_hit_tokens(c.hit_tokens);
  p->set_lookup_tokens(c.lookup_tokens);
  p->set_block_tokens(static_cast<uint32_t>(c.block_tokens));
  p->set_inserted(c.inserted);
}

// The heartbeat's report of what `cache` holds (the most recently used kReportedPrefixBlocks).
template <typename Block>
v1::PrefixBlocks PrefixBlocksReport(const PrefixBlockCache<Block>& cache) {
  v1::PrefixBlocks report;
  report.set_block_tokens(static_cast<uint32_t>(cache.block_tokens()));
  for (uint64_t key : cache.RoutingKeys(kReportedPrefixBlocks)) report.add_blocks(key);
  return report;
}

}  // namespace scd

#endif  // SCD_PROTO_PREFIX_CACHE_STATS_H_
