// PrefixBlockCache<Block>: the mechanism every prefix cache shares (the producer's KV and codes,
// a consumer's rebuilt caches), written once. It holds immutable blocks keyed by a hash chain
// (base/prefix_hash.h): a block is present only while its parent is (a chain is a path in a tree
// of blocks), and what is found for a prompt is always a run of blocks from its start.
//   - Byte budget with LRU eviction of whole trailing blocks: only leaves (blocks no other block
//     extends) are evicted, least recently used first, so a prefix never loses its middle.
//   - Copy-on-write: a block is a shared_ptr<const Block>; readers keep what they found alive even
//     when it is evicted or replaced meanwhile (Update grows a block, e.g. with codes for one
//     more encoding).
//   - Single-flight: a request that will compute blocks claims them (Claim); a second request
//     whose next missing block is claimed waits for that claim to end, then looks again, so
//     concurrent requests for one prefix compute it once. A claim that ends without Insert (a
//     failed or cancelled prefill) leaves nothing behind: the waiter computes it itself.
//   - Counters (hits, misses, evictions, ...) and the routing keys of what it holds, most recently
//     used first (the heartbeat's report to the coordinator).
// Block needs `int64_t bytes() const`.
// Thread-safety: thread-safe (one mutex); blocks are immutable once inserted.
#ifndef SCD_BASE_PREFIX_BLOCK_CACHE_H_
#define SCD_BASE_PREFIX_BLOCK_CACHE_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/cancellation.h"
#include "base/clock.h"

namespace scd {

struct PrefixCacheCounters {
  uint64_t entries = 0, bytes = 0, budget_bytes = 0;
  uint64_t hits = 0, misses = 0, evictions = 0, inserted = 0;
  uint64_t hit_tokens = 0, lookup_tokens = 0;
  int block_tokens = 0;
};

template <typename Block>
class PrefixBlockCache {
 public:
  using BlockPtr = std::shared_ptr<const Block>;

  // `budget_bytes` > 0; `block_tokens`: positions per block (for the counters); `clock` (the
  // waits' deadlines) outlives the cache.
  PrefixBlockCache(int64_t budget_bytes, int block_tokens, Clock* clock = Clock::Real())
      : budget_(budget_bytes), block_tokens_(block_tokens), clock_(clock) {}
  PrefixBlockCache(const PrefixBlockCache&) = delete;
  PrefixBlockCache& operator=(const PrefixBlockCache&) = delete;

  int block_tokens() const { return block_tokens_; }
  int64_t budget_bytes() const { return budget_; }

  // The longest run keys[0, k) held, k <= limit; marks them used. No counters (Record does).
  std::vector<BlockPtr> Lookup(const std::vector<std::string>& keys, size_t limit) {
    absl::MutexLock lock(&mu_);
    std::vector<BlockPtr> found;
    for (size_t i = 0; i < keys.size() && i < limit; ++i) {
      auto it = nodes_.find(keys[i]);
      if (it == nodes_.end()) break;
      TouchLocked(&it->second);
      found.push_back(it->second.block);
    }
    return found;
  }

  // Counts one lookup of `lookup_tokens` positions of which `hit_tokens` were reused.
  void Record(int64_t hit_tokens, int64_t lookup_tokens) {
    absl::MutexLock lock(&mu_);
    ++(hit_tokens > 0 ? counters_.hits : counters_.misses);
    counters_.hit_tokens += static_cast<uint64_t>(std::max<int64_t>(0, hit_tokens));
    counters_.lookup_tokens += static_cast<uint64_t>(std::max<int64_t>(0, lookup_tokens));
  }

  // Inserts blocks[j] under keys[from + j] (routing[from + j] its routing key). Nothing is
  // inserted past a missing parent: keys[from - 1] must be held (from == 0: a chain's root). A key
  // already held keeps its block. Then evicts to the budget. Returns the blocks newly inserted.
  size_t Insert(const std::vector<std::string>& keys, const std::vector<uint64_t>& routing,
                size_t from, std::vector<BlockPtr> blocks) {
    absl::MutexLock lock(&mu_);
    if (from > 0 && nodes_.count(keys[from - 1]) == 0) return 0;
    size_t inserted = 0;
    for (size_t j = 0; j < blocks.size() && from + j < keys.size(); ++j) {
      const size_t i = from + j;
      auto it = nodes_.find(keys[i]);
      if (it != nodes_.end()) {
        TouchLocked(&it->second);
        continue;
      }
      Node node;
      node.key = keys[i];
      node.parent = i > 0 ? keys[i - 1] : std::string();
      node.routing = i < routing.size() ? routing[i] : 0;
      node.block = std::move(blocks[j]);
      node.bytes = node.block->bytes();
      if (!node.parent.empty()) {
        Node& parent = nodes_.at(node.parent);
        if (parent.children++ == 0) leaves_.erase({parent.tick, parent.key});
      }
      node.tick = ++tick_;
      leaves_.insert({node.tick, node.key});
      bytes_ += node.bytes;
      nodes_.emplace(node.key, std::move(node));
      ++inserted;
    }
    counters_.inserted += inserted;
    EvictLocked();
    return inserted;
  }

  // Replaces the block under `key` with `grow(current)` under the cache's lock, so two requests
  // growing one block (e.g. with codes of two encodings) never lose either's addition; a null
  // result keeps the current block. Then evicts to the budget. Returns whether it was replaced.
  bool Update(const std::string& key, const std::function<BlockPtr(const Block&)>& grow) {
    absl::MutexLock lock(&mu_);
    auto it = nodes_.find(key);
    if (it == nodes_.end()) return false;
    BlockPtr grown = grow(*it->second.block);
    if (grown == nullptr) return false;
    bytes_ -= it->second.bytes;
    it->second.block = std::move(grown);
    it->second.bytes = it->second.block->bytes();
    bytes_ += it->second.bytes;
    EvictLocked();
    return true;
  }

  // The right to compute keys[from, to) for the cache; ends (waking waiters) when destroyed.
  class Claim {
   public:
    Claim(Claim&& other) noexcept : cache_(other.cache_), keys_(std::move(other.keys_)) {
      other.cache_ = nullptr;
    }
    Claim& operator=(Claim&& other) noexcept {
      if (this != &other) {
        if (cache_ != nullptr) cache_->Release(keys_);
        cache_ = other.cache_;
        keys_ = std::move(other.keys_);
        other.cache_ = nullptr;
      }
      return *this;
    }
    ~Claim() {
      if (cache_ != nullptr) cache_->Release(keys_);
    }

   private:
    friend class PrefixBlockCache;
    Claim(PrefixBlockCache* cache, std::vector<std::string> keys)
        : cache_(cache), keys_(std::move(keys)) {}
    PrefixBlockCache* cache_;
    std::vector<std::string> keys_;
  };

  // Claims keys[from, to) (those nobody else claims) unless keys[from] is claimed by another
  // request: then waits until that claim ends, `until` passes or `cancel` (may be null) is
  // cancelled (its callback wakes the wait), and returns nullopt (look up again; after `until`
  // or a cancel, compute without a claim). `until` is on the cache's clock.
  std::optional<Claim> ClaimOrWait(const std::vector<std::string>& keys, size_t from, size_t to,
                                   absl::Time until, Cancellation* cancel) {
    // A cancel wakes the wait: taking the mutex makes it look at its condition again.
    Cancellation::Registration wake;
    if (cancel != nullptr)
      wake = cancel->OnCancel([this](const absl::Status&) { absl::MutexLock l(&mu_); });
    absl::MutexLock lock(&mu_);
    if (from < to && from < keys.size() && claimed_.count(keys[from]) > 0) {
      const std::string& next = keys[from];
      auto released = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return claimed_.count(next) == 0 || (cancel != nullptr && cancel->cancelled());
      };
      ++waits_;
      clock_->AwaitWithDeadline(&mu_, absl::Condition(&released), until);
      return std::nullopt;
    }
    std::vector<std::string> mine;
    for (size_t i = from; i < to && i < keys.size(); ++i) {
      if (claimed_.insert(keys[i]).second) mine.push_back(keys[i]);
    }
    return Claim(this, std::move(mine));
  }

  PrefixCacheCounters Counters() const {
    absl::MutexLock lock(&mu_);
    PrefixCacheCounters c = counters_;
    c.entries = nodes_.size();
    c.bytes = static_cast<uint64_t>(bytes_);
    c.budget_bytes = static_cast<uint64_t>(budget_);
    c.block_tokens = block_tokens_;
    return c;
  }
  // How often a request waited for another's claim (single-flight at work).
  uint64_t waits() const {
    absl::MutexLock lock(&mu_);
    return waits_;
  }
  bool Contains(const std::string& key) const {
    absl::MutexLock lock(&mu_);
    return nodes_.count(key) > 0;
  }

  // Routing keys of the blocks held, most recently used first, at most `max`.
  std::vector<uint64_t> RoutingKeys(size_t max) const {
    absl::MutexLock lock(&mu_);
    std::vector<std::pair<uint64_t, uint64_t>> by_tick;  // (tick, routing)
    by_tick.reserve(nodes_.size());
    for (const auto& [key, node] : nodes_) by_tick.push_back({node.tick, node.routing});
    std::sort(by_tick.begin(), by_tick.end(),
              [](const auto& a, const auto& b) { return a.first > b.first; });
    std::vector<uint64_t> keys;
    for (size_t i = 0; i < by_tick.size() && i < max; ++i) keys.push_back(by_tick[i].second);
    return keys;
  }

 private:
  struct Node {
    std::string key, parent;  // parent "" for a chain's first block
    uint64_t routing = 0;
    BlockPtr block;
    int64_t bytes = 0;
    uint64_t tick = 0;  // last use
    int children = 0;
  };

  void TouchLocked(Node* node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const bool leaf = node->children == 0;
    if (leaf) leaves_.erase({node->tick, node->key});
    node->tick = ++tick_;
    if (leaf) leaves_.insert({node->tick, node->key});
  }

  void EvictLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (bytes_ > budget_ && !leaves_.empty()) {
      const std::string key = leaves_.begin()->second;
      leaves_.erase(leaves_.begin());
      auto it = nodes_.find(key);
      bytes_ -= it->second.bytes;
      const std::string parent = it->second.parent;
      nodes_.erase(it);
      ++counters_.evictions;
      if (!parent.empty()) {
        Node& p = nodes_.at(parent);
        if (--p.children == 0) leaves_.insert({p.tick, p.key});
      }
    }
  }

  void Release(const std::vector<std::string>& keys) {
    absl::MutexLock lock(&mu_);
    for (const std::string& key : keys) claimed_.erase(key);
  }

  const int64_t budget_;
  const int block_tokens_;
  Clock* const clock_;
  mutable absl::Mutex mu_;
  std::unordered_map<std::string, Node> nodes_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<uint64_t, std::string>> leaves_ ABSL_GUARDED_BY(mu_);  // (tick, key)
  std::set<std::string> claimed_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t tick_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t waits_ ABSL_GUARDED_BY(mu_) = 0;
  PrefixCacheCounters counters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace scd

#endif  // SCD_BASE_PREFIX_BLOCK_CACHE_H_
