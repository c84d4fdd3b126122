#include "bench/sim_nodes.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace scd::bench::sim {

std::unique_ptr<BlockCache> CacheOf(double mb, int64_t bytes_per_token, Clock* clock) {
  const auto budget = static_cast<int64_t>(mb * 1048576.0);
  if (budget <= 0 || bytes_per_token <= 0) return nullptr;
  return std::make_unique<BlockCache>(budget, kBlock, clock);
}

v1::RegisterRequest ProducerInfo(const SimProducerPool& pool, const std::string& id) {
  v1::RegisterRequest r;
  r.set_role(v1::NODE_ROLE_PRODUCER);
  r.set_address("sim:" + id);
  v1::ModelEntry* m = r.add_models();
  m->set_name(pool.name);
  m->set_fingerprint(absl::StrCat("p:", pool.name));
  r.add_transports("grpc");
  return r;
}

v1::RegisterRequest ConsumerInfo(const SimConsumerPool& pool, const std::string& id) {
  v1::RegisterRequest r;
  r.set_role(v1::NODE_ROLE_CONSUMER);
  r.set_address("sim:" + id);
  r.set_public_address("sim:" + id);
  r.set_transfer_address("sim:" + id + "/transfer");
  v1::ModelEntry* m = r.add_models();
  m->set_name(pool.name);
  m->set_fingerprint(absl::StrCat("c:", pool.name));
  r.add_transports("grpc");
  r.set_capacity(static_cast<uint32_t>(pool.costs.capacity));
  r.set_kv_budget_bytes(static_cast<uint64_t>(pool.costs.kv_budget_bytes));
  r.set_kv_bytes_per_token(static_cast<uint64_t>(pool.costs.kv_bytes_per_token));
  if (!pool.producer.empty()) {
    // The pair's artifact, its frontier one point: the codes the pool pair sends.
    v1::ArtifactEntry* a = r.add_artifacts();
    a->set_id(absl::StrCat("artifact:", pool.producer, ":", pool.name));
    a->set_producer_fingerprint(absl::StrCat("p:", pool.producer));
    a->set_consumer_fingerprint(m->fingerprint());
    v1::FrontierPointEntry* point = a->add_frontier();
    point->mutable_point()->set_code_dtype("f16");
    for (int64_t l = 0; l < pool.layers; ++l) {
      point->mutable_point()->add_rank_k(1);
      point->mutable_point()->add_rank_v(1);
      point->mutable_point()->add_rank_h(0);
    }
    point->set_bytes_per_token(pool.code_bytes_per_token);
    point->set_kl(pool.code_kl);
    point->set_rebuild_us_per_token(pool.costs.rebuild.per_token_us);
    a->set_recommended(0);
  }
  return r;
}

std::vector<std::string> KeysFor(const Req& req, const std::string& mode) {
  std::vector<std::string> keys;
  const int64_t shared = req.r.shared_blocks;
  for (size_t b = 0; b < req.r.blocks.size(); ++b) {
    keys.push_back(static_cast<int64_t>(b) < shared
                       ? absl::StrCat(mode, "/t", req.r.tenant, "g", req.r.group, "b", b)
                       : absl::StrCat(mode, "/r", req.r.id, "b", b));
  }
  return keys;
}

int64_t Cached(BlockCache* cache, const Req& req, const std::string& mode) {
  if (cache == nullptr) return 0;
  const std::vector<std::string> keys = KeysFor(req, mode);
  const auto blocks = static_cast<int64_t>(cache->Lookup(keys, keys.size()).size());
  const int64_t tokens = std::min(blocks * kBlock, req.r.prompt_tokens - 1);
  cache->Record(tokens, req.r.prompt_tokens - 1);
  return tokens;
}

void Keep(BlockCache* cache, const Req& req, const std::string& mode, int64_t bytes_per_token) {
  if (cache == nullptr) return;
  std::vector<BlockCache::BlockPtr> blocks;
  for (size_t b = 0; b < req.r.blocks.size(); ++b) {
    blocks.push_back(std::make_shared<const SimBlock>(SimBlock{bytes_per_token * kBlock}));
  }
  cache->Insert(KeysFor(req, mode), req.r.blocks, 0, std::move(blocks));
}

}  // namespace scd::bench::sim
