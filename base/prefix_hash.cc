#include "base/prefix_hash.h"

#include <cstring>

#include "base/sha256.h"

namespace scd {

std::vector<std::string> PrefixBlockChain(std::string_view cache_salt,
                                          absl::Span<const TokenId> tokens, int block_tokens) {
  std::vector<std::string> chain;
  if (block_tokens < 1) return chain;
  const size_t blocks = tokens.size() / static_cast<size_t>(block_tokens);
  chain.reserve(blocks);
  std::string previous;
  {
    Sha256 root;
    root.Update("scd-prefix-v1");
    const uint64_t salt_size = cache_salt.size();
    root.Update(&salt_size, sizeof(salt_size));  // the salt's length first: no salt is a prefix
    root.Update(cache_salt);
    previous = root.Digest();
  }
  for (size_t b = 0; b < blocks; ++b) {
    Sha256 h;
    h.Update(previous);
    for (int i = 0; i < block_tokens; ++i) {
      const int32_t id = tokens[b * block_tokens + i];
      unsigned char le[4] = {static_cast<unsigned char>(id), static_cast<unsigned char>(id >> 8),
                             static_cast<unsigned char>(id >> 16),
                             static_cast<unsigned char>(id >> 24)};
      h.Update(le, sizeof(le));
    }
    previous = h.Digest();
    chain.push_back(previous);
  }
  return chain;
}

std::string ScopedBlockKey(std::string_view scope, std::string_view block_hash) {
  Sha256 h;
  const uint64_t scope_size = scope.size();
  h.Update(&scope_size, sizeof(scope_size));
  h.Update(scope);
  h.Update(block_hash);
  return h.Digest();
}

uint64_t RoutingKey(std::string_view block_hash) {
  uint64_t key = 0;
  for (size_t i = 0; i < 8 && i < block_hash.size(); ++i) {
    key |= static_cast<uint64_t>(static_cast<unsigned char>(block_hash[i])) << (8 * i);
  }
  return key;
}

std::vector<uint64_t> RoutingKeys(const std::vector<std::string>& chain) {
  std::vector<uint64_t> keys;
  keys.reserve(chain.size());
  for (const std::string& hash : chain) keys.push_back(RoutingKey(hash));
  return keys;
}

PrefixKeys ScopedPrefixKeys(std::string_view scope, std::string_view cache_salt,
                            absl::Span<const TokenId> prefix, int block_tokens) {
  PrefixKeys keys;
  const std::vector<std::string> chain = PrefixBlockChain(cache_salt, prefix, block_tokens);
  keys.routing = RoutingKeys(chain);
  keys.keys.reserve(chain.size());
  for (const std::string& hash : chain) keys.keys.push_back(ScopedBlockKey(scope, hash));
  return keys;
}

}  // namespace scd
