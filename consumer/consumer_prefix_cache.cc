#include "consumer/consumer_prefix_cache.h"

#include <ATen/ATen.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/exception_guard.h"
#include "base/status_macros.h"
#include "model/tensor_memory.h"

namespace scd::consumer {

int64_t ConsumerBlock::bytes() const {
  int64_t total = 0;
  for (const at::Tensor& t : keys) total += HeldBytes(t);
  for (const at::Tensor& t : values) total += HeldBytes(t);
  return total;
}

ConsumerPrefixCache::ConsumerPrefixCache(const LlamaModel& model, std::string fingerprint,
                                         int64_t budget_bytes, int block_tokens)
    : model_(model), fingerprint_(std::move(fingerprint)), cache_(budget_bytes, block_tokens) {}

std::string ConsumerPrefixCache::RouteScope(TransferMode mode,
                                            const std::string& producer_fingerprint,
                                            const std::string& artifact_id) {
  if (mode == TransferMode::kLocal) return "local";
  return absl::StrCat(TransferModeName(mode), "|", producer_fingerprint, "|", artifact_id);
}

ConsumerPrefixCache::Keys ConsumerPrefixCache::KeysFor(const std::string& route_scope,
                                                       const std::string& cache_salt,
                                                       absl::Span<const TokenId> prefix) const {
  return ScopedPrefixKeys(absl::StrCat(fingerprint_, "|", route_scope), cache_salt, prefix,
                          block_tokens());
}

absl::StatusOr<int64_t> ConsumerPrefixCache::Load(const Keys& keys, int64_t max_tokens,
                                                  int64_t lookup_tokens, KvCache* cache) {
  const int64_t B = block_tokens();
  const size_t limit = max_tokens > 0 ? static_cast<size_t>(max_tokens / B) : 0;
  const std::vector<std::shared_ptr<const ConsumerBlock>> found = cache_.Lookup(keys.keys, limit);
  const int64_t loaded = static_cast<int64_t>(found.size()) * B;
  cache_.Record(loaded, lookup_tokens);
  if (found.empty()) return 0;
  SCD_RETURN_IF_ERROR(GuardExceptions("ConsumerPrefixCache::Load", [&]() -> absl::Status {
    for (int l = 0; l < cache->num_layers(); ++l) {
      std::vector<at::Tensor> k, v;
      for (const auto& block : found) {
        k.push_back(block->keys[l]);
        v.push_back(block->values[l]);
      }
      SCD_RETURN_IF_ERROR(
          model_.LoadPrefix(l, at::cat(k, 1), at::cat(v, 1), KeyFormat::kPostRope, cache));
    }
    return absl::OkStatus();
  }));
  return loaded;
}

size_t ConsumerPrefixCache::Store(const Keys& keys, int64_t from, const KvCache& cache) {
  const int64_t B = block_tokens();
  if (from % B != 0 || from < 0) return 0;
  const size_t first = static_cast<size_t>(from / B);
  size_t last = keys.keys.size();
  for (int l = 0; l < cache.num_layers(); ++l) {
    last = std::min(last, static_cast<size_t>(cache.length(l) / B));
  }
  if (first >= last) return 0;
  std::vector<std::shared_ptr<const ConsumerBlock>> blocks;
  for (size_t b = first; b < last; ++b) {
    auto block = std::make_shared<ConsumerBlock>();
    for (int l = 0; l < cache.num_layers(); ++l) {
      const int64_t begin = static_cast<int64_t>(b) * B;
      block->keys.push_back(CompactTensor(cache.keys(l).narrow(1, begin, B)));
      block->values.push_back(CompactTensor(cache.values(l).narrow(1, begin, B)));
    }
    blocks.push_back(std::move(block));
  }
  std::vector<std::string> prefix_keys(keys.keys.begin(), keys.keys.begin() + last);
  return cache_.Insert(prefix_keys, keys.routing, first, std::move(blocks));
}

}  // namespace scd::consumer
