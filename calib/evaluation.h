// Evaluation (scd-calib eval): runs transfer modes end to end — producer prefill, encode, decode
// into the consumer's cache — over evaluation windows and reports fidelity against the oracle,
// payload bytes per token and the ratio to a raw f16 KV cache; also per-layer depth errors and
// a rank sweep over the nested codes.
// Thread-safety: not thread-safe (one evaluation at a time per object).
#ifndef SCD_CALIB_EVALUATION_H_
#define SCD_CALIB_EVALUATION_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "calib/fidelity.h"
#include "codec/artifact.h"
#include "codec/transfer_plan.h"
#include "model/llama_model.h"
#include "tokenizer/tokenizer.h"

namespace scd {

struct ModeResult {
  TransferMode mode;
  TransferOptions transfer;
  FidelityMetrics metrics;
  double raw_f16_bytes_per_token = 0;
  double payload_ratio() const {
    return raw_f16_bytes_per_token > 0 ? metrics.bytes_per_token / raw_f16_bytes_per_token : 0;
  }
};

struct RankSweepPoint {
  int64_t rank_k = 0, rank_v = 0, rank_h = 0;
  FidelityMetrics metrics;
  double payload_ratio = 0;
  bool pareto = false;  // no other point has both fewer bytes and lower KL
};

class Evaluation {
 public:
  // Windows of prefix + continuation + 1 tokens from `data_path`, spread over the whole file.
  // `artifact` may be null (then only local, raw, int4 and explicit recompute run).
  static absl::StatusOr<Evaluation> Create(const LlamaModel& producer, const LlamaModel& consumer,
                                           const Artifact* artifact, const Tokenizer& tokenizer,
                                           const std::string& data_path, int windows,
                                           const FidelityOptions& options);

  absl::StatusOr<ModeResult> Run(TransferMode mode, const TransferOptions& transfer, bool greedy);
  absl::StatusOr<std::vector<double>> DepthErrors(TransferMode mode,
                                                  const TransferOptions& transfer);
  // KL vs bytes over a grid of (rank_k, rank_v) for `mode` (reuse or scd), Pareto points marked.
  absl::StatusOr<std::vector<RankSweepPoint>> RankSweep(TransferMode mode,
                                                        const TransferOptions& base);

  const FidelityEvaluator& evaluator() const { return evaluator_; }

 private:
  Evaluation(const LlamaModel& producer, const LlamaModel& consumer, const Artifact* artifact,
             FidelityEvaluator evaluator)
      : producer_(&producer),
        consumer_(&consumer),
        artifact_(artifact),
        evaluator_(std::move(evaluator)) {}
  absl::StatusOr<PrefixCacheBuilder> Builder(TransferMode mode, const TransferOptions& transfer);

  const LlamaModel* producer_;
  const LlamaModel* consumer_;
  const Artifact* artifact_;
  FidelityEvaluator evaluator_;
};

// The eval table (one row per mode); calib/report_json.h has the same as JSON.
std::string FormatModeTable(const std::vector<ModeResult>& results);

}  // namespace scd

#endif  // SCD_CALIB_EVALUATION_H_
