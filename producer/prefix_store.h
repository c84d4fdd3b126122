// ProducerPrefixStore: the producer's prefix cache. For every full block of a prefix it has run
// it keeps what its own prefill computed for those positions: pre-RoPE keys and values of every
// layer (its native KV cache, rotated again when loaded) and the activations any of its
// encodings reads beyond them (the attention input at patch layers, the residual stream where a
// recomputed segment starts), so a request extending a cached prefix runs its forward pass over
// the new positions only, and codes for the cached positions are encoded for any consumer's
// artifact and mode without running the prefix again (SCD codes are per position: a position's
// K/V and H never depend on later positions). Keys: the salted block chain (base/prefix_hash.h)
// scoped by the producer's fingerprint. Budget, LRU eviction, single-flight and counters are
// base/prefix_block_cache.h's. The codes encoded from cached blocks are kept with them per
// encoding (CodesKey: artifact, mode, ranks, wire dtypes), packed, so a later hit of the same
// encoding sends them without encoding again (codec/chunk_rows.h joins the blocks' rows).
// Thread-safety: thread-safe.
#ifndef SCD_PRODUCER_PREFIX_STORE_H_
#define SCD_PRODUCER_PREFIX_STORE_H_

#include <ATen/core/Tensor.h>

#include <atomic>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/prefix_block_cache.h"
#include "base/prefix_hash.h"
#include "codec/artifact.h"
#include "codec/code_batch.h"
#include "codec/transfer_plan.h"
#include "model/llama_model.h"

namespace scd::producer {

// One encoding's packed chunks for one block: per layer, what CodeEncoder::EncodeLayer gives
// (in its order; empty for layers the plan sends nothing for) cut to the block's positions.
struct BlockCodes {
  std::vector<std::vector<CodeChunk>> layers;
  // Host memory held (model/tensor_memory.h's HeldBytes of each tensor, and the chunk records).
  int64_t bytes() const;
};

// One block's state: per layer [kv_heads, B, head_dim] keys (pre-RoPE) and values; [B, hidden]
// attention inputs and residuals at the layers the store captures them; and the codes already
// encoded from them, per encoding (CodesKey), added as consumers ask for them.
struct ProducerBlock {
  std::vector<at::Tensor> key_prerope, value;
  std::map<int, at::Tensor> attn_input, residual;
  std::map<std::string, std::shared_ptr<const BlockCodes>> codes;
  // Host memory held: what the cache's budget counts (tensors stored compact, so it bounds them).
  int64_t bytes() const;
};

// What an encoding's bytes depend on: mode, each layer's payload and ranks, the wire dtypes and
// the artifact (its file id). Equal keys give equal chunks for equal activations.
std::string CodesKey(const TransferPlan& plan, const TransferOptions& options,
                     const std::string& artifact_id);

// An encoding's chunks over positions [from, T) of a prefix, per layer (EncodeLayer's), for
// ProducerPrefixStore::AddCodes.
struct EncodedRun {
  std::string key;  // CodesKey; empty: not kept
  int64_t from = 0;
  std::vector<std::vector<CodeChunk>> layers;  // sized to the model's layers
  std::vector<bool> encoded;                   // per layer: its chunks are in `layers`
  bool complete() const;
};

// The cached part of one prefix, found for a request.
struct CachedPrefix {
  int64_t tokens = 0;  // positions [0, tokens) are cached (a multiple of the block size)
  std::vector<std::shared_ptr<const ProducerBlock>> blocks;
};

class ProducerPrefixStore {
 public:
  // `plans`: every transfer plan this producer may serve (every mode with every artifact); the
  // store captures what any of them reads. `budget_bytes` > 0.
  ProducerPrefixStore(const LlamaModel& model, std::string fingerprint,
                      const std::vector<TransferPlan>& plans, int64_t budget_bytes,
                      int block_tokens = kPrefixBlockTokens);

  int block_tokens() const { return cache_.block_tokens(); }
  // What a forward pass must capture for its positions to be stored.
  const CaptureSpec& capture() const { return capture_; }
  // Whether cached blocks hold everything `plan` encodes from.
  bool Serves(const TransferPlan& plan) const;

  // The scoped keys of `prefix`'s full blocks under `cache_salt`, and their routing keys.
  using Keys = PrefixKeys;
  Keys KeysFor(const std::string& cache_salt, absl::Span<const TokenId> prefix) const;
  // The longest cached run of `keys`, at most `limit` blocks (no counters).
  CachedPrefix Lookup(const Keys& keys, size_t limit);
  void Record(int64_t hit_tokens, int64_t lookup_tokens) { cache_.Record(hit_tokens, lookup_tokens); }
  PrefixBlockCache<ProducerBlock>& blocks() { return cache_; }
  const PrefixBlockCache<ProducerBlock>& blocks() const { return cache_; }

  // Loads the cached prefix into the empty `cache` (keys rotated for their positions).
  absl::Status LoadInto(const CachedPrefix& cached, KvCache* cache) const;
  // Layer `layer`'s activations over positions [begin, cached.tokens) from the cached blocks
  // (`begin` a multiple of the block size): what EncodeLayer reads, in `want`'s kinds.
  absl::StatusOr<LayerCapture> CachedCapture(const CachedPrefix& cached, int layer, int64_t begin,
                                             const CaptureSpec& want) const;
  // The end of the run of `cached`'s blocks from position `begin` (a block boundary) that hold
  // codes of encoding `key` (== begin when the first does not).
  int64_t CodedEnd(const CachedPrefix& cached, const std::string& key, int64_t begin) const;
  // Layer `layer`'s chunks over positions [begin, end) joined from the blocks' codes of `key`.
  // REQUIRES: begin < end <= CodedEnd(cached, key, begin).
  absl::StatusOr<std::vector<CodeChunk>> CachedChunks(const CachedPrefix& cached,
                                                      const std::string& key, int layer,
                                                      int64_t begin, int64_t end) const;
  // Keeps `run`'s codes (complete: every layer encoded) for each full block of `keys` it covers
  // that the cache holds and that has none for its key yet; nothing when the encoding is not
  // packed per position (codec/chunk_rows.h). Returns the blocks that gained codes.
  size_t AddCodes(const Keys& keys, const EncodedRun& run);
  // Positions whose codes were served from kept codes rather than encoded again.
  void RecordCodeHits(int64_t tokens) { code_hit_tokens_.fetch_add(static_cast<uint64_t>(tokens)); }
  uint64_t code_hit_tokens() const { return code_hit_tokens_.load(); }

  // Stores the blocks a forward pass over positions [from, from + T) computed (`captures`: per
  // layer, in capture()'s kinds, T positions), after the cached run it extended. Only full blocks
  // are stored; returns how many were new.
  size_t Store(const Keys& keys, int64_t from, const std::map<int, LayerCapture>& captures);

 private:
  const LlamaModel& model_;
  const std::string scope_;
  CaptureSpec capture_;
  std::set<int> attn_input_layers_, residual_layers_;
  PrefixBlockCache<ProducerBlock> cache_;
  std::atomic<uint64_t> code_hit_tokens_{0};
};

// Layer captures over consecutive position ranges joined along positions (undefined parts skip).
LayerCapture JoinCaptures(const LayerCapture& first, const LayerCapture& second);
// Positions [begin, end) of a capture (offsets within it).
LayerCapture SliceCapture(const LayerCapture& capture, int64_t begin, int64_t end);

}  // namespace scd::producer

#endif  // SCD_PRODUCER_PREFIX_STORE_H_
