#include "calib/evaluation.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "calib/text_corpus.h"
#include "codec/transfer.h"

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
  SCD_ASSIGN_OR_RETURN(TransferPath path,
                       TransferPath::Create(mode, *producer_, *consumer_, artifact_, transfer));
  return PrefixCacheBuilder([this, path](int w, KvCache* cache, int64_t* bytes) -> absl::Status {
    SCD_ASSIGN_OR_RETURN(TransferStats stats, path.Run(evaluator_.Prefix(w), cache));
    *bytes = stats.payload_bytes;
    return absl::OkStatus();
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

}  // namespace scd
