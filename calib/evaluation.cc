#include "calib/evaluation.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "calib/text_corpus.h"
#include "codec/code_decoder.h"
#include "codec/code_encoder.h"

namespace scd {

absl::StatusOr<Evaluation> Evaluation::Create(const LlamaModel& producer,
                                              const LlamaModel& consumer, const Artifact* artifact,
                                              const Tokenizer& tokenizer,
                                              const std::string& data_path, int windows,
                                              const FidelityOptions& options) {
  SCD_ASSIGN_OR_RETURN(TextCorpus corpus, TextCorpus::Load(data_path, tokenizer));
  SCD_ASSIGN_OR_RETURN(auto seqs,
                       corpus.Sequences(windows, options.prefix + options.continuation + 1));
  SCD_ASSIGN_OR_RETURN(FidelityEvaluator evaluator,
                       FidelityEvaluator::Create(consumer, std::move(seqs), options));
  return Evaluation(producer, consumer, artifact, std::move(evaluator));
}

absl::StatusOr<PrefixCacheBuilder> Evaluation::Builder(TransferMode mode,
                                                       const TransferOptions& transfer) {
  SCD_ASSIGN_OR_RETURN(TransferPlan plan,
                       TransferPlan::Make(mode, producer_->config(), artifact_, transfer));
  auto encoder = std::make_shared<CodeEncoder>(std::move(plan), artifact_, transfer);
  auto decoder = std::make_shared<CodeDecoder>(*consumer_, artifact_);
  return PrefixCacheBuilder(
      [this, encoder, decoder](int w, KvCache* cache, int64_t* bytes) -> absl::Status {
        const std::vector<TokenId> prefix = evaluator_.Prefix(w);
        SCD_ASSIGN_OR_RETURN(CodeBatch batch, encoder->Prefill(*producer_, prefix));
        *bytes = batch.bytes();
        return decoder->Decode(batch, prefix, cache);
      });
}

absl::StatusOr<ModeResult> Evaluation::Run(TransferMode mode, const TransferOptions& transfer,
                                           bool greedy) {
  SCD_ASSIGN_OR_RETURN(PrefixCacheBuilder build, Builder(mode, transfer));
  ModeResult r;
  r.mode = mode;
  r.transfer = transfer;
  r.raw_f16_bytes_per_token = static_cast<double>(consumer_->config().KvBytesPerToken(2));
  SCD_ASSIGN_OR_RETURN(r.metrics, evaluator_.Evaluate(build, greedy));
  return r;
}

absl::StatusOr<std::vector<double>> Evaluation::DepthErrors(TransferMode mode,
                                                            const TransferOptions& transfer) {
  SCD_ASSIGN_OR_RETURN(PrefixCacheBuilder build, Builder(mode, transfer));
  return evaluator_.DepthErrors(build);
}

absl::StatusOr<std::vector<RankSweepPoint>> Evaluation::RankSweep(TransferMode mode,
                                                                  const TransferOptions& base) {
  if (artifact_ == nullptr) return absl::FailedPreconditionError("a rank sweep needs an artifact");
  int64_t max_k = 0, max_v = 0;
  for (const ArtifactLayer& l : artifact_->layers) {
    max_k = std::max(max_k, l.key.rank());
    max_v = std::max(max_v, l.value.rank());
  }
  auto grid = [](int64_t max) {
    std::vector<int64_t> g;
    for (int64_t r = 1; r < max; r *= 2) g.push_back(r);
    g.push_back(max);
    return g;
  };
  std::vector<RankSweepPoint> points;
  const double raw = static_cast<double>(consumer_->config().KvBytesPerToken(2));
  for (int64_t rk : grid(max_k)) {
    for (int64_t rv : grid(max_v)) {
      TransferOptions t = base;
      t.rank_k = rk;
      t.rank_v = rv;
      SCD_ASSIGN_OR_RETURN(ModeResult r, Run(mode, t, /*greedy=*/false));
      RankSweepPoint p;
      p.rank_k = rk;
      p.rank_v = rv;
      p.rank_h = base.rank_h;
      p.metrics = r.metrics;
      p.payload_ratio = r.metrics.bytes_per_token / raw;
      points.push_back(p);
    }
  }
  for (RankSweepPoint& p : points) {
    p.pareto = std::none_of(points.begin(), points.end(), [&](const RankSweepPoint& q) {
      return q.metrics.bytes_per_token <= p.metrics.bytes_per_token &&
             q.metrics.kl <= p.metrics.kl &&
             (q.metrics.bytes_per_token < p.metrics.bytes_per_token || q.metrics.kl < p.metrics.kl);
    });
  }
  return points;
}

std::string FormatModeTable(const std::vector<ModeResult>& results) {
  std::string out = absl::StrFormat("%-10s %9s %7s %7s %9s %9s %8s %10s %8s\n", "mode", "KL", "TV",
                                    "top1", "PPL", "PPL/orc", "greedy", "bytes/tok", "vs f16");
  for (const ModeResult& r : results) {
    const FidelityMetrics& m = r.metrics;
    absl::StrAppendFormat(
        &out, "%-10s %9.4f %7.4f %7.3f %9.3f %9.3f %8s %10.1f %7.1f%%\n", TransferModeName(r.mode),
        m.kl, m.tv, m.top1, m.ppl, m.ppl_ratio(),
        std::isnan(m.greedy_agreement) ? "-" : absl::StrFormat("%.3f", m.greedy_agreement),
        m.bytes_per_token, 100 * r.payload_ratio());
  }
  if (!results.empty()) {
    absl::StrAppendFormat(&out,
                          "(%d windows, %d scored positions; raw f16 KV = %.0f bytes/token)\n",
                          results[0].metrics.windows, results[0].metrics.positions,
                          results[0].raw_f16_bytes_per_token);
  }
  return out;
}

std::string ModeResultsJson(const std::vector<ModeResult>& results,
                            const std::string& context_json) {
  nlohmann::json j =
      nlohmann::json::parse(context_json.empty() ? "{}" : context_json, nullptr, false);
  if (j.is_discarded()) j = nlohmann::json::object();
  nlohmann::json modes = nlohmann::json::object();
  for (const ModeResult& r : results) {
    nlohmann::json m = nlohmann::json::parse(r.metrics.ToJson());
    if (std::isnan(r.metrics.greedy_agreement)) m["greedy_agreement"] = nullptr;
    m["payload_ratio"] = r.payload_ratio();
    m["raw_f16_bytes_per_token"] = r.raw_f16_bytes_per_token;
    modes[TransferModeName(r.mode)] = m;
  }
  j["modes"] = modes;
  return j.dump(2);
}

}  // namespace scd
