#include "bench/sim_nodes.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/wire_mode.h"

namespace scd::bench::sim {

std::unique_ptr<BlockCache> CacheOf(double mb, int64_t bytes_per_token, Clock* clock) {
  const auto budget = static_cast<int64_t>(mb * 1048576.0);
  if (budget <= 0 || bytes_per_token <= 0) return nullptr;
  return std::make_unique<BlockCache>(budget, kBlock, clock);
}

std::shared_ptr<Admission> AdmissionOf(const SimConsumerPool& pool, Clock* clock) {
  Admission::Options a;
  a.capacity = static_cast<uint32_t>(pool.costs.capacity);
  a.budget_bytes = pool.costs.kv_budget_bytes;
  a.clock = clock;
  return Admission::Create(a);
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

// A rebuild piece of `rows` rows of `w` by the profile: a layer's share of the rebuild's cost (its
// fixed part with the layer's first piece, which unpacks the layer's codes), a tail one token
// through one layer (a one-sequence decode step's share), raw KV and the last logits copied
// (their cost is the first decode's).
double PieceUs(const NodeProfile& k, int64_t layers, const ConsumerNode::Work& w, int64_t rows) {
  const double per_layer = 1.0 / static_cast<double>(layers);
  switch (w.kind) {
    case ConsumerNode::Kind::kLayer:
      if (w.raw) return 0;
      return per_layer * (k.rebuild.per_token_us * static_cast<double>(rows) +
                          (w.rows_left == w.rows ? k.rebuild.fixed_us : 0));
    case ConsumerNode::Kind::kTail:
      return per_layer * k.decode_step.At(1, w.req->r.prompt_tokens);
    case ConsumerNode::Kind::kLogits:
      return 0;
  }
  return 0;
}

v1::Finished FinishedOf(const Req& req, const SimRequestResult& res, absl::Time now) {
  v1::Finished f;
  f.set_reason("length");
  f.set_prompt_tokens(static_cast<uint32_t>(req.r.prompt_tokens));
  f.set_output_tokens(static_cast<uint32_t>(req.r.output_tokens));
  SetRanMode(req.mode, &f);
  f.set_producer_cached_tokens(static_cast<uint32_t>(res.producer_cached));
  f.set_consumer_cached_tokens(static_cast<uint32_t>(res.consumer_cached));
  v1::Timings* t = f.mutable_timings();
  const double ttft_us = absl::ToDoubleMicroseconds(req.first_token - req.arrival);
  t->set_ttft(static_cast<uint64_t>(ttft_us));
  t->set_total(static_cast<uint64_t>(absl::ToDoubleMicroseconds(now - req.arrival)));
  if (req.mode == TransferMode::kLocal) {
    t->set_prefill(static_cast<uint64_t>(ttft_us));
    return f;
  }
  const SimConsumerPool& pool = *req.consumer->spec;
  const double per_token = req.mode == TransferMode::kRaw ? pool.costs.kv_bytes_per_token / 2.0
                                                          : pool.code_bytes_per_token;
  f.set_payload_bytes(static_cast<uint64_t>(static_cast<double>(req.sent) * per_token));
  t->set_prefill(static_cast<uint64_t>(req.prefill_us));
  t->set_transfer(static_cast<uint64_t>(req.transfer_us));
  t->set_rebuild(static_cast<uint64_t>(req.rebuild_us));
  t->set_first_decode(static_cast<uint64_t>(req.first_decode_us));
  return f;
}

namespace {

void AddPrefixBlocks(const BlockCache* cache, v1::HeartbeatRequest* hb) {
  if (cache == nullptr) return;
  hb->mutable_prefix_blocks()->set_block_tokens(kBlock);
  for (uint64_t k : cache->RoutingKeys(kReportedBlocks)) hb->mutable_prefix_blocks()->add_blocks(k);
}

}  // namespace

v1::HeartbeatRequest HeartbeatOf(const ProducerNode& p) {
  v1::HeartbeatRequest hb;
  hb.set_node_id(p.id);
  hb.set_active_requests(static_cast<uint32_t>(p.queue.size() + p.passes.size()));
  *hb.mutable_speeds() = p.speeds->Report();
  AddPrefixBlocks(p.cache.get(), &hb);
  return hb;
}

v1::HeartbeatRequest HeartbeatOf(const ConsumerNode& c) {
  v1::HeartbeatRequest hb;
  hb.set_node_id(c.id);
  hb.set_active_requests(c.admission->active());
  hb.set_kv_reserved_bytes(static_cast<uint64_t>(c.admission->reserved_bytes()));
  hb.set_queued_requests(c.admission->queued());
  hb.set_kv_queued_bytes(static_cast<uint64_t>(c.admission->queued_bytes()));
  *hb.mutable_speeds() = c.speeds->Report();
  SetPerTokenCost(c.pacer.local_itl().UsPerToken(), hb.mutable_speeds()->mutable_local_itl());
  SetPerTokenCost(c.rebuild_itl.UsPerToken(), hb.mutable_speeds()->mutable_rebuild_itl());
  uint32_t decoding = 0;
  for (const ConsumerNode::Seq& s : c.seqs) decoding += s.decoding ? 1 : 0;
  hb.set_decoding_sequences(decoding);
  AddPrefixBlocks(c.cache.get(), &hb);
  return hb;
}

}  // namespace scd::bench::sim

namespace scd::bench {

void SimTimeline::Add(double from_s, double duration_s) {
  if (!(duration_s > 0) || !(bin_s > 0)) return;
  const double from = std::max(0.0, from_s), end = from_s + duration_s;
  for (auto bin = static_cast<size_t>(from / bin_s);; ++bin) {
    const double lo = std::max(from, static_cast<double>(bin) * bin_s);
    const double hi = std::min(end, static_cast<double>(bin + 1) * bin_s);
    if (hi > lo) {
      if (seconds.size() <= bin) seconds.resize(bin + 1, 0.0);
      seconds[bin] += hi - lo;
    }
    if (static_cast<double>(bin + 1) * bin_s >= end) break;
  }
}

double SimTimelineBin(double duration_s) { return std::max(0.01, duration_s / 100); }

}  // namespace scd::bench
