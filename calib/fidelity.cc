#include "calib/fidelity.h"

#include <ATen/ATen.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "model/generator.h"

namespace scd {
namespace {

// Continuation targets: tokens [P + 1, P + C + 1).
at::Tensor Targets(const std::vector<TokenId>& window, int prefix, int continuation) {
  std::vector<int64_t> t(window.begin() + prefix + 1, window.begin() + prefix + continuation + 1);
  return at::tensor(t, at::TensorOptions().dtype(at::kLong));
}

// Greedy tokens after the window's first prefix + 1 tokens, reusing the cache's first `prefix`
// positions (whatever the cache held beyond them is dropped first).
absl::StatusOr<std::vector<TokenId>> GreedyAfterPrefix(const LlamaModel& model,
                                                       const std::vector<TokenId>& window,
                                                       int prefix, int tokens, KvCache* cache) {
  SCD_RETURN_IF_ERROR(cache->Truncate(prefix));
  GenerationOptions gen;
  gen.max_tokens = tokens;
  gen.ignore_eos = true;
  SCD_ASSIGN_OR_RETURN(
      GenerationResult r,
      GenerateTokens(model, absl::MakeConstSpan(window).first(prefix + 1), cache, gen));
  return std::move(r.output_ids);
}

CaptureSpec AttnInputsOfAllLayers(const ModelConfig& config) {
  CaptureSpec spec;
  for (int l = 0; l < config.num_layers; ++l) spec.layers.push_back(l);
  spec.attn_input = true;
  return spec;
}

at::Tensor StackAttnInputs(const Captures& captures, int64_t first_row, int64_t rows) {
  std::vector<at::Tensor> per_layer;
  for (const auto& [layer, c] : captures)
    per_layer.push_back(c.attn_input.narrow(0, first_row, rows));
  return at::stack(per_layer).to(at::kCPU, at::kFloat);  // [layers, rows, hidden]
}

}  // namespace

FidelityEvaluator::FidelityEvaluator(const LlamaModel& consumer,
                                     std::vector<std::vector<TokenId>> windows,
                                     FidelityOptions options)
    : consumer_(&consumer), windows_(std::move(windows)), options_(options) {}

std::vector<TokenId> FidelityEvaluator::Prefix(int window) const {
  const auto& w = windows_[window];
  return std::vector<TokenId>(w.begin(), w.begin() + options_.prefix);
}

absl::StatusOr<FidelityEvaluator> FidelityEvaluator::Create(
    const LlamaModel& consumer, std::vector<std::vector<TokenId>> windows,
    const FidelityOptions& options) {
  const int P = options.prefix, C = options.continuation;
  if (P < 1 || C < 1) return absl::InvalidArgumentError("prefix and continuation must be >= 1");
  for (const auto& w : windows) {
    if (static_cast<int>(w.size()) != P + C + 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("evaluation windows must hold prefix + continuation + 1 = ", P + C + 1,
                       " tokens, got ", w.size()));
    }
  }
  if (windows.empty()) return absl::InvalidArgumentError("no evaluation windows");
  FidelityEvaluator e(consumer, std::move(windows), options);
  const CaptureSpec attn = AttnInputsOfAllLayers(consumer.config());
  for (const auto& w : e.windows_) {
    std::vector<TokenId> seq(w.begin(), w.begin() + P + C);
    KvCache cache = consumer.NewCache(P + C);
    SCD_ASSIGN_OR_RETURN(
        ForwardOutput out,
        consumer.Forward(seq, &cache, {.logits = LogitsMode::kAll, .capture = &attn}));
    at::Tensor log_probs = at::log_softmax(out.logits.narrow(0, P, C).to(at::kCPU), -1);
    e.oracle_nll_ -= log_probs.gather(1, Targets(w, P, C).unsqueeze(1)).sum().item<double>();
    e.oracle_log_probs_.push_back(log_probs);
    e.oracle_attn_inputs_.push_back(StackAttnInputs(out.captures, P, C));
    if (options.greedy_tokens > 0) {
      SCD_ASSIGN_OR_RETURN(std::vector<TokenId> greedy,
                           GreedyAfterPrefix(consumer, w, P, options.greedy_tokens, &cache));
      e.oracle_greedy_.push_back(std::move(greedy));
    }
  }
  return e;
}

absl::StatusOr<FidelityMetrics> FidelityEvaluator::Evaluate(const PrefixCacheBuilder& build,
                                                            bool greedy) const {
  const int P = options_.prefix, C = options_.continuation;
  FidelityMetrics m;
  double kl = 0, tv = 0, top1 = 0, nll = 0, agree = 0;
  int64_t payload = 0, greedy_positions = 0;
  for (int i = 0; i < static_cast<int>(windows_.size()); ++i) {
    const auto& w = windows_[i];
    KvCache cache = consumer_->NewCache(P + std::max(C, options_.greedy_tokens + 1));
    int64_t bytes = 0;
    SCD_RETURN_IF_ERROR(build(i, &cache, &bytes));
    if (!cache.uniform() || cache.length() != P) {
      return absl::InternalError(
          absl::StrCat("builder left the cache at ", cache.length(), " positions, expected ", P));
    }
    payload += bytes;
    SCD_ASSIGN_OR_RETURN(ForwardOutput out,
                         consumer_->Forward(absl::MakeConstSpan(w).subspan(P, C), &cache,
                                            {.logits = LogitsMode::kAll}));
    at::Tensor lp = at::log_softmax(out.logits.to(at::kCPU, at::kDouble), -1);  // mode
    at::Tensor lo = oracle_log_probs_[i].to(at::kDouble);                       // oracle
    at::Tensor po = lo.exp();
    kl += (po * (lo - lp)).sum().item<double>();
    tv += 0.5 * (po - lp.exp()).abs().sum().item<double>();
    top1 += (lp.argmax(-1) == lo.argmax(-1)).sum().item<double>();
    nll -= lp.gather(1, Targets(w, P, C).unsqueeze(1)).sum().item<double>();
    if (greedy && options_.greedy_tokens > 0) {
      SCD_ASSIGN_OR_RETURN(std::vector<TokenId> output,
                           GreedyAfterPrefix(*consumer_, w, P, options_.greedy_tokens, &cache));
      const auto& o = oracle_greedy_[i];
      for (size_t t = 0; t < o.size(); ++t) agree += (t < output.size() && output[t] == o[t]);
      greedy_positions += static_cast<int64_t>(o.size());
    }
  }
  const double positions = static_cast<double>(windows_.size()) * C;
  m.windows = static_cast<int64_t>(windows_.size());
  m.positions = static_cast<int64_t>(positions);
  m.kl = kl / positions;
  m.tv = tv / positions;
  m.top1 = top1 / positions;
  m.ppl = std::exp(nll / positions);
  m.oracle_ppl = std::exp(oracle_nll_ / positions);
  m.greedy_agreement = greedy_positions > 0 ? agree / greedy_positions : std::nan("");
  m.bytes_per_token = static_cast<double>(payload) / (static_cast<double>(windows_.size()) * P);
  return m;
}

absl::StatusOr<std::vector<double>> FidelityEvaluator::DepthErrors(
    const PrefixCacheBuilder& build) const {
  const int P = options_.prefix, C = options_.continuation;
  const CaptureSpec attn = AttnInputsOfAllLayers(consumer_->config());
  const int64_t layers = consumer_->config().num_layers;
  at::Tensor err = at::zeros({layers}, at::kDouble), ref = at::zeros({layers}, at::kDouble);
  for (int i = 0; i < static_cast<int>(windows_.size()); ++i) {
    KvCache cache = consumer_->NewCache(P + C);
    int64_t bytes = 0;
    SCD_RETURN_IF_ERROR(build(i, &cache, &bytes));
    SCD_ASSIGN_OR_RETURN(ForwardOutput out,
                         consumer_->Forward(absl::MakeConstSpan(windows_[i]).subspan(P, C), &cache,
                                            {.logits = LogitsMode::kNone, .capture = &attn}));
    at::Tensor h = StackAttnInputs(out.captures, 0, C).to(at::kDouble);
    at::Tensor o = oracle_attn_inputs_[i].to(at::kDouble);
    err += (h - o).pow(2).sum({1, 2});
    ref += o.pow(2).sum({1, 2});
  }
  at::Tensor rel = (err / ref).sqrt();
  return std::vector<double>(rel.data_ptr<double>(), rel.data_ptr<double>() + layers);
}

}  // namespace scd
