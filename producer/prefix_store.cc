#include "producer/prefix_store.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/exception_guard.h"
#include "base/prefix_hash.h"
#include "base/status_macros.h"
#include "codec/chunk_rows.h"
#include "codec/transfer_mode.h"
#include "model/tensor_memory.h"

namespace scd::producer {
namespace {

// Joins two tensors along positions (`dim`), either may be undefined.
at::Tensor Join(const at::Tensor& a, const at::Tensor& b, int64_t dim) {
  if (!a.defined()) return b;
  if (!b.defined()) return a;
  return at::cat({a, b}, dim);
}

at::Tensor Slice(const at::Tensor& t, int64_t dim, int64_t begin, int64_t end) {
  return t.defined() ? t.narrow(dim, begin, end - begin) : t;
}

}  // namespace

int64_t ProducerBlock::bytes() const {
  int64_t total = 0;
  for (const at::Tensor& t : key_prerope) total += HeldBytes(t);
  for (const at::Tensor& t : value) total += HeldBytes(t);
  for (const auto& [layer, t] : attn_input) total += HeldBytes(t);
  for (const auto& [layer, t] : residual) total += HeldBytes(t);
  for (const auto& [key, c] : codes) total += c->bytes();
  return total;
}

int64_t BlockCodes::bytes() const {
  // The chunks' records and shapes too: a block's codes are a few dozen small chunks.
  int64_t total = static_cast<int64_t>(sizeof(BlockCodes));
  for (const std::vector<CodeChunk>& layer : layers) {
    total += static_cast<int64_t>(layer.capacity() * sizeof(CodeChunk));
    for (const CodeChunk& chunk : layer) {
      total += HeldBytes(chunk.data) + HeldBytes(chunk.scales) +
               static_cast<int64_t>(chunk.shape.capacity() * sizeof(int64_t));
    }
  }
  return total;
}

bool EncodedRun::complete() const {
  return !key.empty() && !encoded.empty() &&
         std::all_of(encoded.begin(), encoded.end(), [](bool done) { return done; });
}

std::string CodesKey(const TransferPlan& plan, const TransferOptions& options,
                     const std::string& artifact_id) {
  std::string key = absl::StrCat(TransferModeName(plan.mode), "|", artifact_id, "|",
                                 WireDtypeName(options.raw_dtype), "|",
                                 WireDtypeName(options.code_dtype));
  for (size_t l = 0; l < plan.layers.size(); ++l) {
    absl::StrAppend(&key, "|", static_cast<int>(plan.layers[l]), ":", plan.rank_k[l], ",",
                    plan.rank_v[l], ",", plan.rank_h[l]);
  }
  for (const auto& [begin, end] : plan.segments) absl::StrAppend(&key, "|s", begin, "-", end);
  return key;
}

LayerCapture JoinCaptures(const LayerCapture& first, const LayerCapture& second) {
  LayerCapture out;
  out.key_prerope = Join(first.key_prerope, second.key_prerope, 1);
  out.value = Join(first.value, second.value, 1);
  out.attn_input = Join(first.attn_input, second.attn_input, 0);
  out.residual = Join(first.residual, second.residual, 0);
  return out;
}

LayerCapture SliceCapture(const LayerCapture& capture, int64_t begin, int64_t end) {
  LayerCapture out;
  out.key_prerope = Slice(capture.key_prerope, 1, begin, end);
  out.value = Slice(capture.value, 1, begin, end);
  out.attn_input = Slice(capture.attn_input, 0, begin, end);
  out.residual = Slice(capture.residual, 0, begin, end);
  return out;
}

ProducerPrefixStore::ProducerPrefixStore(const LlamaModel& model, std::string fingerprint,
                                         const std::vector<TransferPlan>& plans,
                                         int64_t budget_bytes, int block_tokens)
    : model_(model), scope_(std::move(fingerprint)), cache_(budget_bytes, block_tokens) {
  for (const TransferPlan& plan : plans) {
    for (size_t l = 0; l < plan.layers.size(); ++l) {
      if (plan.layers[l] == LayerPayload::kPatch) attn_input_layers_.insert(static_cast<int>(l));
    }
    for (const auto& [begin, end] : plan.segments) {
      if (begin != 0) residual_layers_.insert(begin);
    }
  }
  for (int l = 0; l < static_cast<int>(model.config().num_layers); ++l) capture_.layers.push_back(l);
  capture_.key_prerope = capture_.value = true;
  capture_.attn_input = !attn_input_layers_.empty();
  capture_.residual = !residual_layers_.empty();
}

bool ProducerPrefixStore::Serves(const TransferPlan& plan) const {
  for (size_t l = 0; l < plan.layers.size(); ++l) {
    if (plan.layers[l] == LayerPayload::kPatch &&
        attn_input_layers_.count(static_cast<int>(l)) == 0) {
      return false;
    }
  }
  for (const auto& [begin, end] : plan.segments) {
    if (begin != 0 && residual_layers_.count(begin) == 0) return false;
  }
  return true;
}

ProducerPrefixStore::Keys ProducerPrefixStore::KeysFor(const std::string& cache_salt,
                                                       absl::Span<const TokenId> prefix) const {
  return ScopedPrefixKeys(scope_, cache_salt, prefix, block_tokens());
}

CachedPrefix ProducerPrefixStore::Lookup(const Keys& keys, size_t limit) {
  CachedPrefix cached;
  cached.blocks = cache_.Lookup(keys.keys, limit);
  cached.tokens = static_cast<int64_t>(cached.blocks.size()) * block_tokens();
  return cached;
}

absl::Status ProducerPrefixStore::LoadInto(const CachedPrefix& cached, KvCache* cache) const {
  if (cached.blocks.empty()) return absl::OkStatus();
  return GuardExceptions("ProducerPrefixStore::LoadInto", [&]() -> absl::Status {
    const int layers = static_cast<int>(model_.config().num_layers);
    for (int l = 0; l < layers; ++l) {
      std::vector<at::Tensor> k, v;
      for (const auto& block : cached.blocks) {
        k.push_back(block->key_prerope[l]);
        v.push_back(block->value[l]);
      }
      SCD_RETURN_IF_ERROR(
          model_.LoadPrefix(l, at::cat(k, 1), at::cat(v, 1), KeyFormat::kPreRope, cache));
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<LayerCapture> ProducerPrefixStore::CachedCapture(const CachedPrefix& cached,
                                                                int layer, int64_t begin,
                                                                const CaptureSpec& want) const {
  const int64_t B = block_tokens();
  if (begin % B != 0 || begin < 0 || begin > cached.tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("cached positions from ", begin, " of ", cached.tokens));
  }
  return GuardExceptions("ProducerPrefixStore::CachedCapture", [&]() -> absl::StatusOr<LayerCapture> {
    LayerCapture out;
    if (begin == cached.tokens) return out;
    std::vector<at::Tensor> k, v, h, r;
    for (size_t b = static_cast<size_t>(begin / B); b < cached.blocks.size(); ++b) {
      const ProducerBlock& block = *cached.blocks[b];
      if (want.key_prerope) k.push_back(block.key_prerope[layer]);
      if (want.value) v.push_back(block.value[layer]);
      if (want.attn_input) {
        auto it = block.attn_input.find(layer);
        if (it != block.attn_input.end()) h.push_back(it->second);
      }
      if (want.residual) {
        auto it = block.residual.find(layer);
        if (it != block.residual.end()) r.push_back(it->second);
      }
    }
    const size_t blocks = cached.blocks.size() - static_cast<size_t>(begin / B);
    if (!k.empty()) out.key_prerope = at::cat(k, 1);
    if (!v.empty()) out.value = at::cat(v, 1);
    if (h.size() == blocks) out.attn_input = at::cat(h, 0);  // only where every block has it
    if (r.size() == blocks) out.residual = at::cat(r, 0);
    return out;
  });
}

int64_t ProducerPrefixStore::CodedEnd(const CachedPrefix& cached, const std::string& key,
                                      int64_t begin) const {
  const int64_t B = block_tokens();
  if (key.empty() || begin % B != 0 || begin < 0) return begin;
  size_t b = static_cast<size_t>(begin / B);
  while (b < cached.blocks.size() && cached.blocks[b]->codes.count(key) > 0) ++b;
  return std::max<int64_t>(begin, static_cast<int64_t>(b) * B);
}

absl::StatusOr<std::vector<CodeChunk>> ProducerPrefixStore::CachedChunks(
    const CachedPrefix& cached, const std::string& key, int layer, int64_t begin,
    int64_t end) const {
  const int64_t B = block_tokens();
  if (begin % B != 0 || end % B != 0 || begin >= end || end > CodedEnd(cached, key, begin)) {
    return absl::InternalError(absl::StrCat("no kept codes for positions [", begin, ", ", end,
                                            ") of encoding ", key));
  }
  std::vector<const BlockCodes*> blocks;
  for (int64_t b = begin / B; b < end / B; ++b) {
    blocks.push_back(cached.blocks[static_cast<size_t>(b)]->codes.at(key).get());
  }
  if (layer < 0 || layer >= static_cast<int>(blocks.front()->layers.size())) {
    return absl::InternalError(absl::StrCat("kept codes have no layer ", layer));
  }
  const size_t kinds = blocks.front()->layers[layer].size();
  std::vector<CodeChunk> out;
  for (size_t c = 0; c < kinds; ++c) {
    std::vector<const CodeChunk*> parts;
    for (const BlockCodes* codes : blocks) {
      if (codes->layers[layer].size() != kinds) {
        return absl::InternalError(absl::StrCat("kept codes of layer ", layer, " differ per block"));
      }
      parts.push_back(&codes->layers[layer][c]);
    }
    SCD_ASSIGN_OR_RETURN(CodeChunk joined, JoinChunkRows(parts));
    out.push_back(std::move(joined));
  }
  return out;
}

size_t ProducerPrefixStore::AddCodes(const Keys& keys, const EncodedRun& run) {
  const int64_t B = block_tokens();
  const int layers = static_cast<int>(model_.config().num_layers);
  if (!run.complete() || static_cast<int>(run.layers.size()) != layers || run.from % B != 0) {
    return 0;
  }
  // The positions every chunk covers: [from, end).
  int64_t end = -1;
  for (const std::vector<CodeChunk>& layer : run.layers) {
    for (const CodeChunk& chunk : layer) {
      if (chunk.token_begin != run.from) return 0;
      end = end < 0 ? chunk.token_end : std::min(end, chunk.token_end);
    }
  }
  if (end < 0) return 0;  // nothing is sent for any layer
  size_t added = 0;
  const size_t last = std::min(keys.keys.size(), static_cast<size_t>(end / B));
  for (size_t b = static_cast<size_t>(run.from / B); b < last; ++b) {
    const int64_t begin = static_cast<int64_t>(b) * B;
    auto codes = std::make_shared<BlockCodes>();
    for (const std::vector<CodeChunk>& layer : run.layers) {
      std::vector<CodeChunk> sliced;
      for (const CodeChunk& chunk : layer) {
        absl::StatusOr<CodeChunk> rows = SliceChunkRows(chunk, begin, begin + B);
        if (!rows.ok()) return added;  // not packed per position: not kept
        sliced.push_back(*std::move(rows));
      }
      codes->layers.push_back(std::move(sliced));
    }
    const bool grown = cache_.Update(
        keys.keys[b], [&](const ProducerBlock& block) -> std::shared_ptr<const ProducerBlock> {
          if (block.codes.count(run.key) > 0) return nullptr;  // kept already
          auto copy = std::make_shared<ProducerBlock>(block);  // tensors shared, not copied
          copy->codes.emplace(run.key, codes);
          return copy;
        });
    if (grown) ++added;
  }
  return added;
}

size_t ProducerPrefixStore::Store(const Keys& keys, int64_t from,
                                  const std::map<int, LayerCapture>& captures) {
  const int64_t B = block_tokens();
  const int layers = static_cast<int>(model_.config().num_layers);
  if (from % B != 0 || static_cast<int>(captures.size()) != layers) return 0;
  const size_t first = static_cast<size_t>(from / B);
  if (first >= keys.keys.size()) return 0;
  std::vector<std::shared_ptr<const ProducerBlock>> blocks;
  for (size_t b = first; b < keys.keys.size(); ++b) {
    const int64_t begin = static_cast<int64_t>(b) * B - from, end = begin + B;
    auto block = std::make_shared<ProducerBlock>();
    for (int l = 0; l < layers; ++l) {
      const LayerCapture& c = captures.at(l);
      if (!c.key_prerope.defined() || !c.value.defined() || c.key_prerope.size(1) < end) {
        return 0;  // not what capture() asks for: store nothing
      }
      block->key_prerope.push_back(CompactTensor(c.key_prerope.narrow(1, begin, B)));
      block->value.push_back(CompactTensor(c.value.narrow(1, begin, B)));
      if (attn_input_layers_.count(l) > 0 && c.attn_input.defined()) {
        block->attn_input[l] = CompactTensor(c.attn_input.narrow(0, begin, B));
      }
      if (residual_layers_.count(l) > 0 && c.residual.defined()) {
        block->residual[l] = CompactTensor(c.residual.narrow(0, begin, B));
      }
    }
    blocks.push_back(std::move(block));
  }
  return cache_.Insert(keys.keys, keys.routing, first, std::move(blocks));
}

}  // namespace scd::producer
