// LlamaModel: the Llama-family decoder (llama, mistral, qwen2) on libtorch. It runs prefill and
// incremental decode against a KvCache, records per-layer activations on request (capture
// hooks: pre-RoPE keys, values, attention input, residual stream), continues from an external
// cache (how a consumer skips prefill) and runs any layer range from a given hidden state (how
// recompute and patching re-enter the network).
//
// Positions: the tokens of a call sit at positions [cache length, cache length + T); a cache
// slot's index is its position.
//
// Batched steps (ForwardBatch): several sequences, each with its own cache and positions, advance
// in one pass: their rows share every norm, projection, MLP and the LM head as one GEMM over the
// batch's rows (the weights are read once per step, not once per sequence); RoPE takes each
// sequence's own positions; attention runs per sequence against its own cache. That layout was
// measured against padding the batch's caches to one length and masking (bench/model_bench.cc,
// `attention/...`; bench/README.md): the caches live in separate tensors, so padding copies every
// visible key and value of every sequence once per layer and step, more memory traffic than the
// attention itself, while the per-sequence loop reads each cache in place; the loop's cost is a
// few small bmm calls per sequence and layer. A sequence alone in a step runs exactly what
// Forward runs (bit-identical); in a batch its rows go through GEMMs instead of GEMVs (the same
// sums in another order).
//
// One concept in a long file: llama_model.cc (about 640 lines) is the forward of one network --
// prefill, decode, batched steps, captures and layer ranges share its per-layer code path, and
// the precisions' and kernels' own code lives in files of their own (model/packed_weight.h,
// model/skinny_gemm.h, model/decode_attention.h).
// Thread-safety: immutable after construction. Const methods may run concurrently as long as
// each call uses its own KvCaches.
#ifndef SCD_MODEL_LLAMA_MODEL_H_
#define SCD_MODEL_LLAMA_MODEL_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/token_id.h"
#include "model/config.h"
#include "model/kv_cache.h"
#include "model/packed_weight.h"
#include "model/rope.h"
#include "model/runtime.h"
#include "model/skinny_gemm.h"
#include "model/weights.h"

namespace scd {

// Which activations a forward pass records. Default-constructed: none, and then capturing costs
// nothing. Captured tensors are fresh copies the caller owns.
struct CaptureSpec {
  std::vector<int> layers;   // layer indices to record
  bool key_prerope = false;  // keys before RoPE   [kv_heads, T, head_dim]
  bool value = false;        // values             [kv_heads, T, head_dim]
  bool attn_input = false;   // post-RMSNorm input of attention ("H")  [T, hidden]
  bool residual = false;     // hidden state entering the layer        [T, hidden]

  // Every layer, keys + values + attention input.
  static CaptureSpec All(const ModelConfig& config);
  bool empty() const { return layers.empty(); }
};

struct LayerCapture {
  at::Tensor key_prerope, value, attn_input, residual;  // undefined unless requested
};
using Captures = std::map<int, LayerCapture>;

enum class LogitsMode {
  kNone,  // no logits (e.g. a producer that only needs the cache)
  kLast,  // logits of the last token, [1, vocab]
  kAll,   // logits of every token, [T, vocab]
};

class DecodeWorkspace;

// Called by Forward for each layer, in layer order, as soon as everything a capture can hold for
// that layer exists: after the layer's K/V projection, before its attention and MLP (every capture
// kind -- residual, attention input, pre-RoPE keys, values -- is taken there). The capture holds
// empty tensors when the spec does not name it; the callback owns it. This is how a producer
// encodes and sends layer l while layer l's attention and MLP and layers l+1.. compute. A non-OK
// status stops the pass and Forward returns it; the cache is then partial (discard it).
using LayerCallback = std::function<absl::Status(int layer, LayerCapture capture)>;

struct ForwardOptions {
  LogitsMode logits = LogitsMode::kLast;
  const CaptureSpec* capture = nullptr;  // not owned; nullptr = capture nothing
  // Per-sequence state reused across steps (LlamaModel::NewWorkspace); nullptr = rebuild per
  // call. Results are bit-identical either way.
  const DecodeWorkspace* workspace = nullptr;
  // Per-layer hand-off (see LayerCallback). When set, captures go to it and not to
  // ForwardOutput::captures, so a layer's activations can be freed as soon as it is encoded.
  LayerCallback on_layer = nullptr;
};

// What a sequence's steps share and no step should rebuild: the RoPE tables (keys, and queries
// with the attention scale folded in) for every position up to the capacity it was made for.
// Made by LlamaModel::NewWorkspace for one model; owned by the caller next to its KvCache.
// Thread-safety: immutable after construction; may be shared by concurrent calls.
class DecodeWorkspace {
 public:
  int64_t capacity() const { return capacity_; }

 private:
  friend class LlamaModel;
  int64_t capacity_ = 0;
  at::Tensor k_cos, k_sin;  // [capacity, hd/2]
  at::Tensor q_cos, q_sin;  // [capacity, hd/2], times 1/sqrt(head_dim)
};

struct ForwardOutput {
  at::Tensor logits;  // float32 on the model's device; undefined for kNone
  Captures captures;
};

// One sequence's part of a batched step (LlamaModel::ForwardBatch).
struct BatchSequence {
  absl::Span<const TokenId> tokens;  // new tokens (>= 1), at [cache->length(), + tokens.size())
  KvCache* cache = nullptr;          // the sequence's own cache (every layer at one length)
  const DecodeWorkspace* workspace = nullptr;  // its RoPE tables (optional)
  bool logits = true;                // return the logits of its last new token
  // With `logits`: of its last this-many new tokens ([logit_rows, vocab]; 1 to tokens.size()).
  int64_t logit_rows = 1;
};

// How transferred keys are expressed.
enum class KeyFormat {
  kPreRope,   // keys before rotation; rotated here with this model's own rope config
  kPostRope,  // keys already rotated for their positions; copied as they are
};

class LlamaModel {
 public:
  struct Options {
    c10::ScalarType dtype = c10::kFloat;  // f32; bf16/f16 where the device supports them
    // Weights below `dtype` on a CPU (model/packed_weight.h): bf16, f16 or int8 panels for the
    // runtime's own kernels, activations and KV cache in float32. kDense: weights in `dtype`.
    WeightFormat weights = WeightFormat::kDense;
    c10::Device device = c10::Device(c10::kCPU);
    // Projections of at most this many rows (decode steps, alone or batched), and any projection
    // by a small matrix, through SkinnyGemm (model/skinny_gemm.h: reads the weights once for
    // every row, bit-identical per row whatever the batch) where the CPU runs it; 0: off.
    int64_t skinny_rows = kSkinnyMaxRows;
    // Decode rows (one new token of a sequence) append to their cache and attend on memory,
    // without a tensor per row (model/decode_attention.h), where the CPU runs the kernel.
    bool decode_attention_kernel = true;
    // So do a prompt segment's rows, each against its own visible keys (AttendRowsOnKernel),
    // while rows x visible keys x kv width <= this: each row reads its keys anew, where ATen's
    // blocked products reuse a key across rows but pay per op. Measured on one core: 143 rows
    // of the 260k models (0.65 M): fastest 10 % lower, median 31-51 %; tinystories-4m 8 %
    // faster at 128 rows (2.1 M), 5-18 % slower at 256 (8.4 M). 0: never.
    int64_t prompt_attention_kernel_work = int64_t{1} << 22;
    // Otherwise single-row projections as matrix-vector products: on CPU BLAS a GEMV streams the
    // weights at memory bandwidth, a GEMM with one row at a fraction of it (bench/README.md).
    bool gemv_single_rows = true;
  };

  // Loads config.json + safetensors (single or sharded) from a Hugging Face model directory.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Load(const std::string& dir,
                                                          const Options& options);
  // Seeded random weights for `config` (speed work on configs without weights).
  static std::unique_ptr<LlamaModel> Dummy(const ModelConfig& config, uint64_t seed,
                                           const Options& options);
  // Dummy weights for the config at `config_path` (a config.json, or a directory holding one),
  // keeping its first `layers` layers when > 0.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> DummyFromConfig(const std::string& config_path,
                                                                     uint64_t seed, int64_t layers,
                                                                     const Options& options);
  // Wraps weights built by the caller (tests, conversion tools); dense weights are packed here
  // when `options.weights` asks for it.
  // REQUIRES: tensor shapes match `config`; dtype and device match `options`.
  static std::unique_ptr<LlamaModel> FromWeights(ModelConfig config, ModelWeights weights,
                                                 const Options& options);

  LlamaModel(const LlamaModel&) = delete;
  LlamaModel& operator=(const LlamaModel&) = delete;

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  const RotaryEmbedding& rope() const { return rope_; }
  c10::ScalarType dtype() const { return options_.dtype; }
  // Its config's near-tie bound (ModelConfig::NearTieBound) at the epsilon of its compute dtype,
  // plus what packed weights' rounding of each projection's input adds.
  double NearTieBound() const;
  WeightFormat weight_format() const { return options_.weights; }
  Precision precision() const { return {options_.dtype, options_.weights}; }
  c10::Device device() const { return options_.device; }
  // Directory the weights came from ("" for dummy weights).
  const std::string& source() const { return source_; }

  // An empty cache for this model (capacity is a hint in tokens).
  KvCache NewCache(int64_t capacity) const;
  // A workspace for a sequence of up to `capacity` positions (clamped to max positions); steps
  // beyond it fall back to building their tables. Up to kSharedRopePositions it is a view of
  // tables made once at load (no work per sequence).
  DecodeWorkspace NewWorkspace(int64_t capacity) const;
  static constexpr int64_t kSharedRopePositions = 8192;

  // Runs `tokens` through every layer, appending their K/V to `cache`.
  // REQUIRES: all cache layers hold the same number of positions.
  absl::StatusOr<ForwardOutput> Forward(absl::Span<const TokenId> tokens, KvCache* cache,
                                        const ForwardOptions& options = {}) const;

  // Runs every sequence's new tokens as one step (see the file comment), appending each
  // sequence's K/V to its own cache. Returns, per sequence in order, float32 [logit_rows, vocab]
  // logits of its last tokens where asked (undefined otherwise). INVALID_ARGUMENT: an empty batch,
  // a sequence without tokens or with logit_rows outside [1, its tokens], a cache not made for
  // this model, shared between two sequences or not uniform;
  // OUT_OF_RANGE: a sequence past max_position_embeddings. On an error no cache was changed.
  absl::StatusOr<std::vector<at::Tensor>> ForwardBatch(
      absl::Span<const BatchSequence> batch) const;

  // Token embeddings [T, hidden].
  absl::StatusOr<at::Tensor> Embed(absl::Span<const TokenId> tokens) const;
  // Runs layers [begin, end) on `hidden` [T, hidden] for the positions that follow what each of
  // those cache layers already holds (they must agree), appending K/V to those layers only.
  // Returns the hidden state leaving layer end - 1. Captures go to `captures` when `capture` asks.
  absl::StatusOr<at::Tensor> RunLayers(int begin, int end, const at::Tensor& hidden, KvCache* cache,
                                       const CaptureSpec* capture = nullptr,
                                       Captures* captures = nullptr) const;
  // Final RMSNorm + LM head: [T, hidden] -> float32 logits [T, vocab].
  at::Tensor Logits(const at::Tensor& hidden) const;

  // Installs an external prefix for one layer: keys and values [kv_heads, t, head_dim] appended
  // after what `layer` already holds. Pre-RoPE keys are rotated at `positions` ([t] int64;
  // default: the slots they land in) with this model's rope config.
  absl::Status LoadPrefix(int layer, const at::Tensor& keys, const at::Tensor& values,
                          KeyFormat format, KvCache* cache,
                          const at::Tensor& positions = at::Tensor()) const;

  // This model's own pre-RoPE keys and values from an attention input H [T, hidden] of `layer`:
  // (H W_k^T + b_k, H W_v^T + b_v), each [kv_heads, T, head_dim]. Used by patch aligners.
  std::pair<at::Tensor, at::Tensor> ProjectKeyValue(int layer, const at::Tensor& attn_input) const;

 private:
  LlamaModel(ModelConfig config, ModelWeights weights, Options options, std::string source);

  absl::Status CheckTokens(absl::Span<const TokenId> tokens) const;
  absl::Status CheckCache(const KvCache& cache) const;
  // Per-call state shared by every layer of one RunLayers call.
  struct AttentionBlock {
    int64_t t0, t1;            // query tokens [t0, t1) of the call
    int64_t k_begin, k_count;  // cache slots the block can see
    int64_t mask_col = 0;      // first score column `mask` covers
    at::Tensor mask;           // bool [rows, cols], true = hidden; undefined: all visible
  };
  struct StepContext {
    int64_t p0 = 0, tokens = 0;
    at::Tensor q_cos, q_sin;  // [T, hd/2], attention scale folded in
    at::Tensor k_cos, k_sin;  // [T, hd/2]
    std::vector<AttentionBlock> blocks;
  };
  // A step's RoPE tables over every segment's rows, shaped to broadcast against the queries
  // [rows, kv_heads, group, hd / 2] and the keys [rows, kv_heads, hd / 2].
  struct StepTables {
    at::Tensor q_cos, q_sin;  // [rows, 1, 1, hd/2]
    at::Tensor k_cos, k_sin;  // [rows, 1, hd/2]
  };
  StepContext PlanStep(int64_t p0, int64_t tokens, const at::Tensor& like,
                       const DecodeWorkspace* workspace) const;
  // One sequence's rows [row0, row0 + step.tokens) of a step's hidden state, and its cache.
  struct Segment {
    int64_t row0 = 0;
    StepContext step;
    KvCache* cache = nullptr;
  };
  StepTables JoinTables(absl::Span<const Segment> segments) const;
  // RunLayers without argument checks; `h` is owned by the call and updated in place.
  // With `on_layer`, each layer's capture is handed to it instead of `captures`.
  absl::StatusOr<at::Tensor> RunLayersOwned(int begin, int end, at::Tensor h, KvCache* cache,
                                            const CaptureSpec* capture, Captures* captures,
                                            const DecodeWorkspace* workspace,
                                            const LayerCallback* on_layer = nullptr) const;
  at::Tensor Linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) const;
  // x W^T + b with W dense (Linear) or packed.
  at::Tensor Project(const at::Tensor& x, const at::Tensor& dense, const PackedWeight& packed,
                     const at::Tensor& b) const;
  // One decoder layer in place on `h` [rows, hidden], the rows of every segment.
  // Captures (one segment only): `captured` (may be null) runs once the layer's captures are
  // taken; an error from it stops the layer there and is returned.
  absl::Status RunLayer(int layer, at::Tensor& h, absl::Span<const Segment> segments,
                        const StepTables& tables, LayerCapture* capture, const CaptureSpec* spec,
                        const std::function<absl::Status()>* captured = nullptr) const;
  // A segment's attention: its rows of the rotated queries [T, Hkv, g, hd], rotated keys and
  // values [T, Hkv, hd]; K/V appended to its cache, its rows of `attn` [T, Hkv, g, hd] written.
  void AttendSegment(int layer, const at::Tensor& q_rot, const at::Tensor& k_rot,
                     const at::Tensor& v, const Segment& segment, at::Tensor* attn) const;
  // A decode row on a CPU in float32 (fast_decode_rows_): its K/V row appended on memory; false
  // (nothing appended) where the kernel does not apply. May throw (the cache grows).
  bool AppendDecodeRow(int layer, const at::Tensor& k_rot, const at::Tensor& v,
                       const Segment& segment) const;
  // Its attention with DecodeAttention into its row of `attn`, once appended. Never throws: the
  // decode rows of a step run it side by side on the compute pool (SkinnyParallelFor).
  void AttendDecodeRow(int layer, const at::Tensor& q_rot, const Segment& segment,
                       at::Tensor* attn) const;
  // One row's attention on DecodeAttention: the query `q` [Hkv, g, hd] at `position` against the
  // cache layer's keys it sees (all up to it, or its sliding window), into `out` [Hkv, g, hd].
  void AttendRowOnKernel(int layer, const KvCache& cache, int64_t position, const float* q,
                         float* out) const;
  // A prompt segment's attention row by row with DecodeAttention, once its K/V are appended;
  // false (nothing written) where the kernel does not apply or the segment's work is over
  // Options::prompt_attention_kernel_work. Never throws.
  bool AttendRowsOnKernel(int layer, const at::Tensor& q_rot, const Segment& segment,
                          at::Tensor* attn) const;
  // Causal (optionally sliding-window) attention of grouped queries against the cache layer.
  at::Tensor Attend(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                    const StepContext& step) const;
  // The same per kv head and query block, shared over the compute pool with BLAS on each part's
  // own thread, for steps whose projections run on that pool (packed weights, few rows):
  // OpenBLAS's workers otherwise yield-spin beside the pool's threads (compute_steps.h,
  // BlasOnCallingThreads).
  at::Tensor AttendByHead(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                          const StepContext& step) const;
  // NewWorkspace's tables, computed.
  DecodeWorkspace MakeWorkspace(int64_t capacity) const;

  ModelConfig config_;
  ModelWeights weights_;
  Options options_;
  RotaryEmbedding rope_;
  // NewWorkspace's tables for the first min(max positions, kSharedRopePositions) positions, made
  // at load: a row depends only on its position (a table of 130 positions took 0.2 ms to make,
  // on every request's path to its first token). Immutable.
  DecodeWorkspace rope_tables_;
  std::string source_;
  // Decode rows are appended and attended on memory (CPU, float32, model/decode_attention.h).
  bool fast_decode_rows_ = false;
};

// Hidden-state RMSNorm as HF computes it (float32 statistics, then scaled by `weight`).
at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps);

}  // namespace scd

#endif  // SCD_MODEL_LLAMA_MODEL_H_
