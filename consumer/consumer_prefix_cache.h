// ConsumerPrefixCache: a consumer's prefix cache. For every full block of a prefix it has served
// it keeps its own native KV (post-RoPE keys and values of every layer) exactly as the request
// left it: rebuilt from a producer's codes (scoped by that producer's fingerprint, the artifact
// and the mode, so caches rebuilt from different codes never mix) or from its own prefill (scope
// "local", as vLLM's prefix caching would, so local and transferred requests compare fairly). A
// request whose prefix it holds loads that part and asks the producer only for the positions it
// lacks (PrefillTarget.consumer_cached_tokens). Keys: the salted block chain
// (base/prefix_hash.h) scoped by the consumer's fingerprint and the route; budget, LRU eviction
// and counters are base/prefix_block_cache.h's.
// Thread-safety: thread-safe.
#ifndef SCD_CONSUMER_CONSUMER_PREFIX_CACHE_H_
#define SCD_CONSUMER_CONSUMER_PREFIX_CACHE_H_

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/prefix_block_cache.h"
#include "base/prefix_hash.h"
#include "codec/transfer_mode.h"
#include "model/llama_model.h"

namespace scd::consumer {

// One block: per layer post-RoPE keys and values [kv_heads, B, head_dim].
struct ConsumerBlock {
  std::vector<at::Tensor> keys, values;
  int64_t bytes() const;
};

class ConsumerPrefixCache {
 public:
  // `budget_bytes` > 0.
  ConsumerPrefixCache(const LlamaModel& model, std::string fingerprint, int64_t budget_bytes,
                      int block_tokens = kPrefixBlockTokens);

  int block_tokens() const { return cache_.block_tokens(); }

  // The route a cache was made by: "local", or the producer, artifact and mode of its codes.
  static std::string RouteScope(TransferMode mode, const std::string& producer_fingerprint,
                                const std::string& artifact_id);

  using Keys = PrefixKeys;
  Keys KeysFor(const std::string& route_scope, const std::string& cache_salt,
               absl::Span<const TokenId> prefix) const;

  // Loads the longest cached run of `keys` covering at most `max_tokens` positions into the empty
  // `cache`; counts the lookup over `lookup_tokens` positions. Returns the positions loaded.
  absl::StatusOr<int64_t> Load(const Keys& keys, int64_t max_tokens, int64_t lookup_tokens,
                               KvCache* cache);
  // Stores the full blocks of positions [from, keys * B) that `cache` holds (every layer must
  // hold them). Returns the blocks newly stored.
  size_t Store(const Keys& keys, int64_t from, const KvCache& cache);

  PrefixBlockCache<ConsumerBlock>& blocks() { return cache_; }
  const PrefixBlockCache<ConsumerBlock>& blocks() const { return cache_; }

 private:
  const LlamaModel& model_;
  const std::string fingerprint_;
  PrefixBlockCache<ConsumerBlock> cache_;
};

}  // namespace scd::consumer

#endif  // SCD_CONSUMER_CONSUMER_PREFIX_CACHE_H_
