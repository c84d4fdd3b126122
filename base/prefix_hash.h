// Prefix block hashes: how prefix caches name what they hold. A prompt is cut into blocks of
// `block_tokens` positions; block i's hash is SHA-256 over block i-1's hash and block i's tokens,
// the chain rooted in the request's cache_salt, so a block's hash names the whole prefix up to it
// and two salts never share a block. A trailing partial block has no hash (it is never cached).
// Nodes key their caches by ScopedBlockKey(scope, hash) (scope: the model fingerprint, and on a
// consumer the producer, artifact and mode too); the coordinator routes on RoutingKey(hash), the
// first 64 bits, which nodes report in their heartbeats. Full 256-bit keys inside a node: a
// crafted collision cannot hand one prompt another's cache (vLLM's CVE-2025-25183).
// Thread-safety: stateless functions.
#ifndef SCD_BASE_PREFIX_HASH_H_
#define SCD_BASE_PREFIX_HASH_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/types/span.h"
#include "base/token_id.h"

namespace scd {

// Positions per prefix block (vLLM's default block size).
inline constexpr int kPrefixBlockTokens = 16;

// The chain over the full blocks of `tokens`: element i (32 raw bytes) covers [0, (i + 1) * B).
std::vector<std::string> PrefixBlockChain(std::string_view cache_salt,
                                          absl::Span<const TokenId> tokens,
                                          int block_tokens = kPrefixBlockTokens);
// A node's key for `block_hash` within `scope` (32 raw bytes).
std::string ScopedBlockKey(std::string_view scope, std::string_view block_hash);
// The coordinator's routing key of a block: its hash's first 8 bytes, little-endian.
uint64_t RoutingKey(std::string_view block_hash);
std::vector<uint64_t> RoutingKeys(const std::vector<std::string>& chain);

// What a node's cache needs of a prefix: its blocks' scoped keys and their routing keys.
struct PrefixKeys {
  std::vector<std::string> keys;  // ScopedBlockKey(scope, chain[i])
  std::vector<uint64_t> routing;  // RoutingKey(chain[i])
};
PrefixKeys ScopedPrefixKeys(std::string_view scope, std::string_view cache_salt,
                            absl::Span<const TokenId> prefix,
                            int block_tokens = kPrefixBlockTokens);

}  // namespace scd

#endif  // SCD_BASE_PREFIX_HASH_H_
