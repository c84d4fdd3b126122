#include "model/llama_model.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/exception_guard.h"
#include "base/status_macros.h"
#include "model/checkpoint.h"
#include "model/compute_steps.h"
#include "model/decode_attention.h"
#include "model/skinny_gemm.h"

namespace scd {
namespace {

// Query rows per attention block: bounds the score matrix to ~rows x keys per kv head, which keeps
// long prefills in cache instead of materialising [heads, T, T].
constexpr int64_t kAttentionRowsPerBlock = 256;

at::Tensor Positions(int64_t begin, int64_t count) {
  return at::arange(begin, begin + count, at::TensorOptions().dtype(at::kLong));
}

}  // namespace

CaptureSpec CaptureSpec::All(const ModelConfig& config) {
  CaptureSpec spec;
  for (int l = 0; l < config.num_layers; ++l) spec.layers.push_back(l);
  spec.key_prerope = spec.value = spec.attn_input = true;
  return spec;
}

at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  // x.to(kFloat) aliases x when it is already float32, so nothing here may write in place to it.
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor normed = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true).add_(eps));
  return normed.to(x.scalar_type()).mul_(weight);
}

LlamaModel::LlamaModel(ModelConfig config, ModelWeights weights, Options options,
                       std::string source)
    : config_(std::move(config)),
      weights_(std::move(weights)),
      options_(options),
      rope_(config_.rope, config_.head_dim),
      source_(std::move(source)),
      fast_decode_rows_(options_.decode_attention_kernel && options_.device.is_cpu() &&
                        options_.dtype == c10::kFloat &&
                        DecodeAttentionAvailable(config_.head_dim)) {
  rope_tables_ = MakeWorkspace(kSharedRopePositions);
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Load(const std::string& dir,
                                                             const Options& options) {
  return GuardExceptions("LlamaModel::Load", [&]() -> absl::StatusOr<std::unique_ptr<LlamaModel>> {
    SCD_ASSIGN_OR_RETURN(
        ModelConfig config,
        ModelConfig::FromFile((std::filesystem::path(dir) / "config.json").string()));
    SCD_ASSIGN_OR_RETURN(auto checkpoint, Checkpoint::Open(dir));
    SCD_ASSIGN_OR_RETURN(ModelWeights weights,
                         ModelWeights::Load(*checkpoint, config, options.dtype, options.device,
                                            options.weights));
    return std::unique_ptr<LlamaModel>(
        new LlamaModel(std::move(config), std::move(weights), options, dir));
  });
}

std::unique_ptr<LlamaModel> LlamaModel::Dummy(const ModelConfig& config, uint64_t seed,
                                              const Options& options) {
  return FromWeights(
      config, ModelWeights::Dummy(config, seed, options.dtype, options.device, options.weights),
      options);
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::DummyFromConfig(
    const std::string& config_path, uint64_t seed, int64_t layers, const Options& options) {
  const std::string path = std::filesystem::is_directory(config_path)
                               ? (std::filesystem::path(config_path) / "config.json").string()
                               : config_path;
  SCD_ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::FromFile(path));
  if (layers > 0) config.num_layers = std::min<int64_t>(config.num_layers, layers);
  return GuardExceptions("LlamaModel::DummyFromConfig",
                         [&]() -> absl::StatusOr<std::unique_ptr<LlamaModel>> {
                           return Dummy(config, seed, options);
                         });
}

std::unique_ptr<LlamaModel> LlamaModel::FromWeights(ModelConfig config, ModelWeights weights,
                                                    const Options& options) {
  if (options.weights != WeightFormat::kDense && !weights.packed()) {
    for (LayerWeights& layer : weights.layers) layer.Pack(options.weights);
    weights.PackHead(config, options.weights);
  }
  return std::unique_ptr<LlamaModel>(
      new LlamaModel(std::move(config), std::move(weights), options, ""));
}

KvCache LlamaModel::NewCache(int64_t capacity) const {
  return KvCache(config_, capacity, options_.dtype, options_.device);
}

DecodeWorkspace LlamaModel::NewWorkspace(int64_t capacity) const {
  const int64_t n = std::max<int64_t>(1, std::min(capacity, config_.max_position_embeddings));
  if (n > rope_tables_.capacity_) return MakeWorkspace(n);
  DecodeWorkspace ws;
  ws.capacity_ = n;
  ws.k_cos = rope_tables_.k_cos.narrow(0, 0, n);
  ws.k_sin = rope_tables_.k_sin.narrow(0, 0, n);
  ws.q_cos = rope_tables_.q_cos.narrow(0, 0, n);
  ws.q_sin = rope_tables_.q_sin.narrow(0, 0, n);
  return ws;
}

DecodeWorkspace LlamaModel::MakeWorkspace(int64_t capacity) const {
  DecodeWorkspace ws;
  ws.capacity_ = std::max<int64_t>(1, std::min(capacity, config_.max_position_embeddings));
  at::Tensor like =
      at::empty({0}, at::TensorOptions().dtype(options_.dtype).device(options_.device));
  std::tie(ws.k_cos, ws.k_sin) = rope_.Tables(Positions(0, ws.capacity_), like);
  const double scale = 1.0 / std::sqrt(static_cast<double>(config_.head_dim));
  ws.q_cos = ws.k_cos * scale;
  ws.q_sin = ws.k_sin * scale;
  return ws;
}

at::Tensor LlamaModel::Project(const at::Tensor& x, const at::Tensor& dense,
                               const PackedWeight& packed, const at::Tensor& b) const {
  return packed.empty() ? Linear(x, dense, b) : packed.Apply(x, b);
}

at::Tensor LlamaModel::Linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) const {
  if (options_.skinny_rows > 0 &&
      (x.size(0) <= options_.skinny_rows || w.numel() <= kSkinnySmallWeights)) {
    at::Tensor y;
    if (SkinnyGemm(x, w, b, &y)) return y;
  }
  if (options_.gemv_single_rows && x.size(0) == 1) {
    at::Tensor row = x.select(0, 0);
    return (b.defined() ? at::addmv(b, w, row) : at::mv(w, row)).unsqueeze(0);
  }
  return b.defined() ? at::addmm(b, x, w.t()) : at::mm(x, w.t());
}

absl::Status LlamaModel::CheckTokens(absl::Span<const TokenId> tokens) const {
  if (tokens.empty()) return absl::InvalidArgumentError("no tokens to run");
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", tokens[i], " at index ", i,
                                                     " is outside the vocabulary [0, ",
                                                     config_.vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status LlamaModel::CheckCache(const KvCache& cache) const {
  if (cache.num_layers() != config_.num_layers || cache.dtype() != options_.dtype ||
      cache.device() != options_.device) {
    return absl::InvalidArgumentError(
        "KV cache was not created for this model (layers, dtype or device differ)");
  }
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> LlamaModel::Embed(absl::Span<const TokenId> tokens) const {
  return GuardExceptions("LlamaModel::Embed", [&]() -> absl::StatusOr<at::Tensor> {
    SCD_RETURN_IF_ERROR(CheckTokens(tokens));
    if (weights_.packed()) {
      const PackedWeight& table = weights_.EmbeddingTable();
      at::Tensor rows = at::empty({static_cast<int64_t>(tokens.size()), table.cols()}, at::kFloat);
      for (size_t i = 0; i < tokens.size(); ++i) {
        table.UnpackRow(tokens[i], rows.data_ptr<float>() + i * table.cols());
      }
      return rows;
    }
    at::Tensor ids = at::empty({static_cast<int64_t>(tokens.size())}, at::kLong);
    std::copy(tokens.begin(), tokens.end(), ids.data_ptr<int64_t>());
    return weights_.embed.index_select(0, ids.to(options_.device));
  });
}

absl::StatusOr<ForwardOutput> LlamaModel::Forward(absl::Span<const TokenId> tokens, KvCache* cache,
                                                  const ForwardOptions& options) const {
  return GuardExceptions("LlamaModel::Forward", [&]() -> absl::StatusOr<ForwardOutput> {
    ComputeStep step;  // shares the BLAS pool with concurrent steps (model/compute_steps.h)
    SCD_RETURN_IF_ERROR(CheckCache(*cache));
    if (!cache->uniform()) {
      return absl::FailedPreconditionError(
          "Forward needs every cache layer at the same length; finish the layer range first");
    }
    SCD_ASSIGN_OR_RETURN(at::Tensor h, Embed(tokens));
    if (static_cast<int64_t>(tokens.size()) + cache->length(0) > config_.max_position_embeddings) {
      return absl::OutOfRangeError(absl::StrCat("sequence of ", tokens.size() + cache->length(0),
                                                " tokens exceeds max_position_embeddings (",
                                                config_.max_position_embeddings, ")"));
    }
    ForwardOutput out;
    // The embedding is a fresh tensor: the layers may update it in place without a copy.
    SCD_ASSIGN_OR_RETURN(
        h, RunLayersOwned(0, static_cast<int>(config_.num_layers), h.to(options_.dtype), cache,
                          options.capture, &out.captures, options.workspace,
                          options.on_layer ? &options.on_layer : nullptr));
    switch (options.logits) {
      case LogitsMode::kNone:
        break;
      case LogitsMode::kLast:
        out.logits = Logits(h.narrow(0, h.size(0) - 1, 1));
        break;
      case LogitsMode::kAll:
        out.logits = Logits(h);
        break;
    }
    return out;
  });
}

absl::StatusOr<at::Tensor> LlamaModel::RunLayers(int begin, int end, const at::Tensor& hidden,
                                                 KvCache* cache, const CaptureSpec* capture,
                                                 Captures* captures) const {
  return GuardExceptions("LlamaModel::RunLayers", [&]() -> absl::StatusOr<at::Tensor> {
    ComputeStep step;
    SCD_RETURN_IF_ERROR(CheckCache(*cache));
    if (begin < 0 || end > config_.num_layers || begin >= end) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layer range [", begin, ", ", end, ") is not inside [0, ", config_.num_layers, ")"));
    }
    if (hidden.dim() != 2 || hidden.size(1) != config_.hidden_size || hidden.size(0) == 0) {
      return absl::InvalidArgumentError(absl::StrCat("hidden state must be [T, ",
                                                     config_.hidden_size, "], got ",
                                                     hidden.sizes().vec().size(), "-d tensor"));
    }
    const int64_t p0 = cache->length(begin);
    for (int l = begin + 1; l < end; ++l) {
      if (cache->length(l) != p0) {
        return absl::FailedPreconditionError(absl::StrCat("cache layers ", begin, " and ", l,
                                                          " hold different lengths (", p0, " vs ",
                                                          cache->length(l), ")"));
      }
    }
    const int64_t T = hidden.size(0);
    if (p0 + T > config_.max_position_embeddings) {
      return absl::OutOfRangeError(absl::StrCat("sequence of ", p0 + T,
                                                " tokens exceeds max_position_embeddings (",
                                                config_.max_position_embeddings, ")"));
    }
    if (capture != nullptr && !capture->empty() && captures == nullptr) {
      return absl::InvalidArgumentError("a capture was requested without somewhere to put it");
    }
    return RunLayersOwned(begin, end, hidden.to(options_.device, options_.dtype).clone(), cache,
                          capture, captures, /*workspace=*/nullptr);
  });
}

absl::StatusOr<at::Tensor> LlamaModel::RunLayersOwned(int begin, int end, at::Tensor h,
                                                      KvCache* cache, const CaptureSpec* capture,
                                                      Captures* captures,
                                                      const DecodeWorkspace* workspace,
                                                      const LayerCallback* on_layer) const {
  const Segment segments[] = {{0, PlanStep(cache->length(begin), h.size(0), h, workspace), cache}};
  const StepTables tables = JoinTables(segments);
  for (int l = begin; l < end; ++l) {
    const bool wanted =
        capture != nullptr &&
        std::find(capture->layers.begin(), capture->layers.end(), l) != capture->layers.end();
    if (on_layer != nullptr) {
      LayerCapture layer_capture;
      const std::function<absl::Status()> hand_off = [&] {
        // The callback may block (a transfer waiting for credit): not counted as computing.
        ComputeStep::Paused paused;
        return (*on_layer)(l, std::move(layer_capture));
      };
      SCD_RETURN_IF_ERROR(RunLayer(l, h, segments, tables, wanted ? &layer_capture : nullptr,
                                   capture, &hand_off));
      continue;
    }
    RunLayer(l, h, segments, tables, wanted ? &(*captures)[l] : nullptr, capture).IgnoreError();
  }
  return h;
}

absl::StatusOr<std::vector<at::Tensor>> LlamaModel::ForwardBatch(
    absl::Span<const BatchSequence> batch) const {
  return GuardExceptions(
      "LlamaModel::ForwardBatch", [&]() -> absl::StatusOr<std::vector<at::Tensor>> {
        ComputeStep step;
        if (batch.empty()) return absl::InvalidArgumentError("ForwardBatch: an empty batch");
        // Every check first: an error leaves every cache as it was.
        std::vector<TokenId> tokens;
        for (size_t i = 0; i < batch.size(); ++i) {
          const BatchSequence& seq = batch[i];
          if (seq.cache == nullptr) {
            return absl::InvalidArgumentError(absl::StrCat("sequence ", i, " has no cache"));
          }
          SCD_RETURN_IF_ERROR(CheckCache(*seq.cache));
          if (!seq.cache->uniform()) {
            return absl::InvalidArgumentError(absl::StrCat(
                "sequence ", i, ": its cache layers hold different lengths"));
          }
          for (size_t j = 0; j < i; ++j) {
            if (batch[j].cache == seq.cache) {
              return absl::InvalidArgumentError(
                  absl::StrCat("sequences ", j, " and ", i, " share one cache"));
            }
          }
          if (seq.tokens.empty()) {
            return absl::InvalidArgumentError(absl::StrCat("sequence ", i, " has no tokens"));
          }
          if (seq.logits &&
              (seq.logit_rows < 1 || seq.logit_rows > static_cast<int64_t>(seq.tokens.size()))) {
            return absl::InvalidArgumentError(absl::StrCat("sequence ", i, ": logits of ",
                                                           seq.logit_rows, " rows of its ",
                                                           seq.tokens.size(), " tokens"));
          }
          const int64_t end = seq.cache->length() + static_cast<int64_t>(seq.tokens.size());
          if (end > config_.max_position_embeddings) {
            return absl::OutOfRangeError(absl::StrCat("sequence ", i, " of ", end,
                                                      " tokens exceeds max_position_embeddings (",
                                                      config_.max_position_embeddings, ")"));
          }
          tokens.insert(tokens.end(), seq.tokens.begin(), seq.tokens.end());
        }
        SCD_ASSIGN_OR_RETURN(at::Tensor h, Embed(tokens));
        // The embedding is a fresh tensor: the layers may update it in place without a copy.
        h = h.to(options_.dtype);
        std::vector<Segment> segments;
        segments.reserve(batch.size());
        std::vector<int64_t> last_rows;  // of the sequences whose logits are asked for
        int64_t row = 0;
        for (const BatchSequence& seq : batch) {
          const int64_t n = static_cast<int64_t>(seq.tokens.size());
          segments.push_back({row, PlanStep(seq.cache->length(), n, h, seq.workspace), seq.cache});
          row += n;
          if (!seq.logits) continue;
          for (int64_t r = row - seq.logit_rows; r < row; ++r) last_rows.push_back(r);
        }
        const StepTables tables = JoinTables(segments);
        for (int l = 0; l < config_.num_layers; ++l) {
          RunLayer(l, h, segments, tables, nullptr, nullptr).IgnoreError();  // no callback: no error
        }
        std::vector<at::Tensor> out(batch.size());
        if (last_rows.empty()) return out;
        // The LM head once for every sequence asking (one row alone: a GEMV, as Forward's).
        at::Tensor last = last_rows.size() == 1
                              ? h.narrow(0, last_rows[0], 1)
                              : h.index_select(0, at::tensor(last_rows).to(h.device()));
        at::Tensor logits = Logits(last);
        int64_t k = 0;
        for (size_t i = 0; i < batch.size(); ++i) {
          if (!batch[i].logits) continue;
          out[i] = logits.narrow(0, k, batch[i].logit_rows);
          k += batch[i].logit_rows;
        }
        return out;
      });
}

double LlamaModel::NearTieBound() const {
  double epsilon = static_cast<double>(std::numeric_limits<float>::epsilon());
  if (options_.dtype == at::kBFloat16) epsilon = 0x1p-7;  // 8 significand bits
  if (options_.dtype == at::kHalf) epsilon = 0x1p-10;     // 11
  if (options_.dtype == at::kDouble) epsilon = std::numeric_limits<double>::epsilon();
  // Packed weights round a projection's input (model/packed_weight.h: to bf16, u = 2^-9, or to
  // the row's int8 grid, u = 1/254): two runs that differ elsewhere may round an element apart,
  // moving the output by 2u of its scale per layer (tests/forward_batch_test.cc,
  // InputRoundingBound), with the same factor 50 for the logits' magnitude.
  const double u = options_.weights == WeightFormat::kBF16   ? 1.0 / 512
                   : options_.weights == WeightFormat::kInt8 ? 1.0 / 254
                                                             : 0.0;
  return config_.NearTieBound(epsilon) + 50 * 2 * u * static_cast<double>(config_.num_layers);
}

LlamaModel::StepContext LlamaModel::PlanStep(int64_t p0, int64_t tokens, const at::Tensor& like,
                                             const DecodeWorkspace* workspace) const {
  StepContext step;
  step.p0 = p0;
  step.tokens = tokens;
  // RoPE tables: sliced from the sequence's workspace, else from the tables made at load, else
  // built once per call. The query tables carry the 1/sqrt(head_dim) attention scale, so scaling
  // costs no extra pass.
  if (workspace == nullptr || p0 + tokens > workspace->capacity()) {
    const at::Tensor& made = rope_tables_.k_cos;
    const bool fits = made.scalar_type() == like.scalar_type() && made.device() == like.device();
    workspace = fits ? &rope_tables_ : nullptr;
  }
  if (workspace != nullptr && p0 + tokens <= workspace->capacity()) {
    step.k_cos = workspace->k_cos.narrow(0, p0, tokens);
    step.k_sin = workspace->k_sin.narrow(0, p0, tokens);
    step.q_cos = workspace->q_cos.narrow(0, p0, tokens);
    step.q_sin = workspace->q_sin.narrow(0, p0, tokens);
  } else {
    std::tie(step.k_cos, step.k_sin) = rope_.Tables(Positions(p0, tokens), like);
    const double scale = 1.0 / std::sqrt(static_cast<double>(config_.head_dim));
    step.q_cos = step.k_cos * scale;
    step.q_sin = step.k_sin * scale;
  }
  // Query blocks and their masks are the same for every layer: build them once.
  const int64_t g = config_.group_size();
  const int64_t window = config_.sliding_window.value_or(0);
  const int64_t block = std::max<int64_t>(1, kAttentionRowsPerBlock / g);
  for (int64_t t0 = 0; t0 < tokens; t0 += block) {
    AttentionBlock b;
    b.t0 = t0;
    b.t1 = std::min(tokens, t0 + block);
    const int64_t first_q = p0 + b.t0, last_q = p0 + b.t1 - 1, n = b.t1 - b.t0;
    // Keys [k_begin, last_q]; earlier ones fall outside every query's window.
    b.k_begin = window > 0 ? std::max<int64_t>(0, first_q - window + 1) : 0;
    b.k_count = last_q + 1 - b.k_begin;
    const bool window_cuts = window > 0 && last_q - window + 1 > b.k_begin;
    if (n > 1 || window_cuts) {
      // Without a window only the block's own diagonal needs masking: every earlier key is
      // visible to every query of the block.
      b.mask_col = window_cuts ? 0 : first_q - b.k_begin;
      at::Tensor q_pos = Positions(first_q, n).repeat_interleave(g).unsqueeze(1);  // [rows, 1]
      at::Tensor k_pos = Positions(b.k_begin + b.mask_col, b.k_count - b.mask_col).unsqueeze(0);
      at::Tensor hidden_keys = k_pos > q_pos;
      if (window_cuts) hidden_keys.logical_or_(k_pos <= q_pos - window);
      b.mask = hidden_keys.to(like.device());
    }
    step.blocks.push_back(std::move(b));
  }
  return step;
}

LlamaModel::StepTables LlamaModel::JoinTables(absl::Span<const Segment> segments) const {
  const int64_t half = config_.head_dim / 2;
  auto join = [&](at::Tensor StepContext::*table) {
    if (segments.size() == 1) return segments[0].step.*table;
    std::vector<at::Tensor> parts;
    parts.reserve(segments.size());
    for (const Segment& segment : segments) parts.push_back(segment.step.*table);
    return at::cat(parts, 0);
  };
  StepTables tables;
  at::Tensor q_cos = join(&StepContext::q_cos), q_sin = join(&StepContext::q_sin);
  const int64_t rows = q_cos.size(0);
  tables.q_cos = q_cos.view({rows, 1, 1, half});
  tables.q_sin = q_sin.view({rows, 1, 1, half});
  tables.k_cos = join(&StepContext::k_cos).view({rows, 1, half});
  tables.k_sin = join(&StepContext::k_sin).view({rows, 1, half});
  return tables;
}

absl::Status LlamaModel::RunLayer(int layer, at::Tensor& h, absl::Span<const Segment> segments,
                                  const StepTables& tables, LayerCapture* capture,
                                  const CaptureSpec* spec,
                                  const std::function<absl::Status()>* captured) const {
  const LayerWeights& w = weights_.layers[layer];
  const int64_t T = h.size(0), Hkv = config_.num_kv_heads, g = config_.group_size(),
                hd = config_.head_dim, qd = config_.q_dim(), kvd = config_.kv_dim();
  if (capture != nullptr && spec->residual) capture->residual = h.clone();

  // Attention block: x = RMSNorm(h); q|k|v = x W_qkv^T (+ b), every segment's rows at once.
  at::Tensor x = RmsNorm(h, w.attn_norm, config_.rms_norm_eps);  // [T, d]
  at::Tensor qkv = Project(x, w.wqkv, w.packed_qkv, w.bqkv);     // [T, qd + 2 kvd]
  at::Tensor k = qkv.narrow(1, qd, kvd).view({T, Hkv, hd});        // pre-RoPE
  at::Tensor v = qkv.narrow(1, qd + kvd, kvd).view({T, Hkv, hd});
  if (capture != nullptr) {  // one segment (Forward, RunLayers)
    if (spec->attn_input) capture->attn_input = x;
    if (spec->key_prerope) capture->key_prerope = k.permute({1, 0, 2}).contiguous();
    if (spec->value) capture->value = v.permute({1, 0, 2}).contiguous();
  }
  // Everything a capture holds exists now: hand it off before attention and the MLP run.
  if (captured != nullptr) SCD_RETURN_IF_ERROR((*captured)());
  // RoPE for every row at once, each at its own sequence's position.
  const at::Tensor q_rot = RotaryEmbedding::Rotate(qkv.narrow(1, 0, qd).view({T, Hkv, g, hd}),
                                                   tables.q_cos, tables.q_sin);
  const at::Tensor k_rot = RotaryEmbedding::Rotate(k, tables.k_cos, tables.k_sin);
  // [T, Hkv, g, hd]: as [T, heads * hd] the head index is kv_head * group + j, as W_o expects.
  at::Tensor attn = at::empty({T, Hkv, g, hd}, h.options());
  // Decode rows on the kernel: appended here, attended side by side on the compute pool (each
  // row on one thread whole: the same result whatever the split).
  std::vector<const Segment*> decode_rows;
  for (const Segment& segment : segments) {
    if (AppendDecodeRow(layer, k_rot, v, segment)) {
      decode_rows.push_back(&segment);
    } else {
      AttendSegment(layer, q_rot, k_rot, v, segment, &attn);
    }
  }
  SkinnyParallelFor(static_cast<int64_t>(decode_rows.size()),
                    [&](int64_t i) { AttendDecodeRow(layer, q_rot, *decode_rows[i], &attn); });
  h.add_(Project(attn.view({T, qd}), w.wo, w.packed_o, w.bo));

  // MLP block: h += W_down (silu(x W_gate^T) * (x W_up^T)).
  x = RmsNorm(h, w.mlp_norm, config_.rms_norm_eps);
  at::Tensor gate_up = Project(x, w.w_gate_up, w.packed_gate_up, w.b_gate_up);  // [T, 2f]
  const int64_t f = config_.intermediate_size;
  at::Tensor act = at::silu(gate_up.narrow(1, 0, f)).mul_(gate_up.narrow(1, f, f));  // [T, f]
  h.add_(Project(act, w.w_down, w.packed_down, w.b_down));
  return absl::OkStatus();
}

bool LlamaModel::AppendDecodeRow(int layer, const at::Tensor& k_rot, const at::Tensor& v,
                                 const Segment& segment) const {
  if (segment.step.tokens != 1 || !fast_decode_rows_) return false;
  const int64_t row = config_.num_kv_heads * config_.head_dim;
  return segment.cache->AppendRow(layer, k_rot.data_ptr<float>() + segment.row0 * row,
                                  v.data_ptr<float>() + segment.row0 * v.stride(0));
}

void LlamaModel::AttendDecodeRow(int layer, const at::Tensor& q_rot, const Segment& segment,
                                 at::Tensor* attn) const {
  const int64_t row = config_.num_kv_heads * config_.group_size() * config_.head_dim;
  const int64_t r0 = segment.row0;
  AttendRowOnKernel(layer, *segment.cache, segment.step.p0, q_rot.data_ptr<float>() + r0 * row,
                    attn->data_ptr<float>() + r0 * row);
}

void LlamaModel::AttendRowOnKernel(int layer, const KvCache& cache, int64_t position,
                                   const float* q, float* out) const {
  // One row never needs a mask: the window, if any, is the key range.
  const int64_t Hkv = config_.num_kv_heads, g = config_.group_size(), hd = config_.head_dim;
  const int64_t window = config_.sliding_window.value_or(0);
  const int64_t first = window > 0 ? std::max<int64_t>(0, position - window + 1) : 0;
  const at::Tensor& keys = cache.key_storage(layer);
  DecodeAttention({q, keys.data_ptr<float>() + first * hd,
                   cache.value_storage(layer).data_ptr<float>() + first * hd, keys.stride(0), Hkv,
                   g, hd, position + 1 - first, out});
}

void LlamaModel::AttendSegment(int layer, const at::Tensor& q_rot, const at::Tensor& k_rot,
                               const at::Tensor& v, const Segment& segment,
                               at::Tensor* attn) const {
  const int64_t r0 = segment.row0, n = segment.step.tokens, Hkv = config_.num_kv_heads,
                g = config_.group_size(), hd = config_.head_dim;
  KvCache* cache = segment.cache;
  cache->Append(layer, k_rot.narrow(0, r0, n).transpose(0, 1), v.narrow(0, r0, n).transpose(0, 1));
  const at::Tensor keys = cache->keys(layer), values = cache->values(layer);
  if (n == 1) {
    const AttentionBlock& b = segment.step.blocks[0];
    const at::Tensor kb = keys.narrow(1, b.k_begin, b.k_count);
    const at::Tensor vb = values.narrow(1, b.k_begin, b.k_count);
    at::Tensor scores = at::bmm(q_rot[r0], kb.transpose(1, 2));  // [Hkv, g, keys]
    at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(vb.scalar_type());
    at::Tensor out = (*attn)[r0];
    at::bmm_out(out, probs, vb);
    return;
  }
  if (AttendRowsOnKernel(layer, q_rot, segment, attn)) return;
  // Queries as [kv_heads, n * group, hd]: the rows of one kv head's queries are then contiguous,
  // so grouped-query attention is a plain bmm against that head's keys.
  at::Tensor q = q_rot.narrow(0, r0, n).permute({1, 0, 2, 3}).reshape({Hkv, n * g, hd});
  at::Tensor o = Attend(q, keys, values, segment.step);  // [Hkv, n*g, hd]
  attn->narrow(0, r0, n).copy_(o.view({Hkv, n, g, hd}).permute({1, 0, 2, 3}));
}

bool LlamaModel::AttendRowsOnKernel(int layer, const at::Tensor& q_rot, const Segment& segment,
                                    at::Tensor* attn) const {
  const int64_t n = segment.step.tokens, p0 = segment.step.p0;
  const KvCache& cache = *segment.cache;
  const int64_t kv_width = config_.num_kv_heads * config_.head_dim;
  if (!fast_decode_rows_ || cache.key_storage(layer).scalar_type() != at::kFloat ||
      n * (p0 + n) * kv_width > options_.prompt_attention_kernel_work) {
    return false;
  }
  const int64_t row = kv_width * config_.group_size();
  const float* q = q_rot.data_ptr<float>() + segment.row0 * row;
  float* out = attn->data_ptr<float>() + segment.row0 * row;
  // Each query row alone against its own visible keys, as a decode row is: no mask, and a row's
  // result is the same whatever the prompt's length or split.
  SkinnyParallelFor(
      n, [&](int64_t t) { AttendRowOnKernel(layer, cache, p0 + t, q + t * row, out + t * row); });
  return true;
}

at::Tensor LlamaModel::Attend(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                              const StepContext& step) const {
  // q: [Hkv, tokens * g, hd], rows ordered (token, group member), already scaled.
  // keys/values: [Hkv, p0 + tokens, hd]; query t sits at position p0 + t.
  const int64_t g = config_.group_size();
  // Where the step's projections ran on the compute pool (packed weights; float32 rows of few
  // tokens, SkinnyGemm), attention runs there too, keeping BLAS's own workers asleep.
  if (q.device().is_cpu() && (weights_.packed() || step.tokens <= options_.skinny_rows)) {
    return AttendByHead(q, keys, values, step);
  }
  std::vector<at::Tensor> outputs;
  outputs.reserve(step.blocks.size());
  for (const AttentionBlock& b : step.blocks) {
    at::Tensor qb = q.narrow(1, b.t0 * g, (b.t1 - b.t0) * g);
    at::Tensor kb = keys.narrow(1, b.k_begin, b.k_count);
    at::Tensor vb = values.narrow(1, b.k_begin, b.k_count);
    at::Tensor scores = at::bmm(qb, kb.transpose(1, 2));  // [Hkv, rows, k_count]
    if (b.mask.defined()) {
      scores.narrow(2, b.mask_col, b.k_count - b.mask_col)
          .masked_fill_(b.mask, -std::numeric_limits<float>::infinity());
    }
    at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(vb.scalar_type());
    outputs.push_back(at::bmm(probs, vb));  // [Hkv, rows, hd]
  }
  return outputs.size() == 1 ? outputs[0] : at::cat(outputs, 1);
}

at::Tensor LlamaModel::AttendByHead(const at::Tensor& q, const at::Tensor& keys,
                                    const at::Tensor& values, const StepContext& step) const {
  const int64_t g = config_.group_size(), Hkv = q.size(0);
  const int64_t blocks = static_cast<int64_t>(step.blocks.size());
  at::Tensor out = at::empty(q.sizes(), q.options());
  BlasOnCallingThreads blas_here;  // each part's products on its own thread (compute_steps.h)
  std::atomic<bool> failed{false};
  std::string error;  // the first failure's (written once, by the thread that set `failed`)
  SkinnyParallelFor(Hkv * blocks, [&](int64_t item) {
    const int64_t h = item / blocks;
    const AttentionBlock& b = step.blocks[item % blocks];
    try {
      const int64_t rows = (b.t1 - b.t0) * g;
      at::Tensor kb = keys[h].narrow(0, b.k_begin, b.k_count);
      at::Tensor vb = values[h].narrow(0, b.k_begin, b.k_count);
      at::Tensor scores = at::mm(q[h].narrow(0, b.t0 * g, rows), kb.t());  // [rows, k_count]
      if (b.mask.defined()) {
        scores.narrow(1, b.mask_col, b.k_count - b.mask_col)
            .masked_fill_(b.mask, -std::numeric_limits<float>::infinity());
      }
      at::Tensor slice = out[h].narrow(0, b.t0 * g, rows);
      at::mm_out(slice, at::softmax(scores, -1, at::kFloat).to(vb.scalar_type()), vb);
    } catch (const std::exception& e) {  // a worker of the pool has nowhere to throw
      if (!failed.exchange(true)) error = e.what();
    } catch (...) {
      if (!failed.exchange(true)) error = "unknown exception";
    }
  });
  if (failed) throw std::runtime_error("attention of a prefill: " + error);
  return out;
}

at::Tensor LlamaModel::Logits(const at::Tensor& hidden) const {
  at::Tensor x = RmsNorm(hidden, weights_.final_norm, config_.rms_norm_eps);
  return Project(x, weights_.lm_head, weights_.packed_lm_head, at::Tensor()).to(at::kFloat);
}

absl::Status LlamaModel::LoadPrefix(int layer, const at::Tensor& keys, const at::Tensor& values,
                                    KeyFormat format, KvCache* cache,
                                    const at::Tensor& positions) const {
  return GuardExceptions("LlamaModel::LoadPrefix", [&]() -> absl::Status {
    SCD_RETURN_IF_ERROR(CheckCache(*cache));
    if (layer < 0 || layer >= config_.num_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", layer, " is outside [0, ", config_.num_layers, ")"));
    }
    const auto expect = [&](const at::Tensor& t, const char* what) -> absl::Status {
      if (!t.defined() || t.dim() != 3 || t.size(0) != config_.num_kv_heads ||
          t.size(2) != config_.head_dim) {
        return absl::InvalidArgumentError(absl::StrCat(
            "layer ", layer, " ", what, " must be [", config_.num_kv_heads, ", T, ",
            config_.head_dim, "]", t.defined() ? absl::StrCat(", got ", t.dim(), "-d") : ""));
      }
      return absl::OkStatus();
    };
    SCD_RETURN_IF_ERROR(expect(keys, "keys"));
    SCD_RETURN_IF_ERROR(expect(values, "values"));
    const int64_t t = keys.size(1);
    if (values.size(1) != t) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", layer, ": ", t, " keys but ", values.size(1), " values"));
    }
    const int64_t start = cache->length(layer);
    if (start + t > config_.max_position_embeddings) {
      return absl::OutOfRangeError(absl::StrCat("prefix of ", start + t,
                                                " positions exceeds max_position_embeddings (",
                                                config_.max_position_embeddings, ")"));
    }
    at::Tensor k = keys.to(options_.device, options_.dtype);
    at::Tensor v = values.to(options_.device, options_.dtype);
    if (format == KeyFormat::kPreRope) {
      at::Tensor pos = positions.defined() ? positions : Positions(start, t);
      if (pos.dim() != 1 || pos.size(0) != t) {
        return absl::InvalidArgumentError(
            absl::StrCat("layer ", layer, ": positions must be [", t, "]"));
      }
      k = rope_.Apply(k, pos);
    }
    cache->Append(layer, k, v);
    return absl::OkStatus();
  });
}

std::pair<at::Tensor, at::Tensor> LlamaModel::ProjectKeyValue(int layer,
                                                              const at::Tensor& attn_input) const {
  const LayerWeights& w = weights_.layers[layer];
  const int64_t T = attn_input.size(0), Hkv = config_.num_kv_heads, hd = config_.head_dim;
  at::Tensor x = attn_input.to(options_.device, options_.dtype);
  at::Tensor k, v;
  if (!w.packed_qkv.empty()) {
    // W_k and W_v are rows [q_dim, q_dim + 2 kv_dim) of the packed W_qkv; a slice must start on a
    // panel (16 rows), else the whole product is taken and narrowed.
    const int64_t qd = config_.q_dim(), kvd = config_.kv_dim();
    at::Tensor kv = qd % 16 == 0 ? w.packed_qkv.Apply(x, w.bqkv, qd, 2 * kvd)
                                 : w.packed_qkv.Apply(x, w.bqkv).narrow(1, qd, 2 * kvd);
    k = kv.narrow(1, 0, kvd);
    v = kv.narrow(1, kvd, kvd);
  } else {
    k = Linear(x, w.Wk(config_), w.Bk(config_));
    v = Linear(x, w.Wv(config_), w.Bv(config_));
  }
  return {k.view({T, Hkv, hd}).permute({1, 0, 2}).contiguous(),
          v.view({T, Hkv, hd}).permute({1, 0, 2}).contiguous()};
}

}  // namespace scd
