// Calibrate(): the offline fit of one producer -> consumer pair (scd-calib fit), one function per
// stage:
//   1. LoadCalibrationData: calibration prefixes (+ a vocabulary sweep) and a held-out split;
//   2. CollectPairedTraces: paired prefills of both models, streamed into PairedTraces;
//   3. FitTranslators: reuse translators for K and V of every layer, a hidden-state basis each;
//   4. SelectLayerPolicies: patch layers by the paper's policy, F = -KL(oracle || mode) on the
//      held-out split; the DroidSpeak-style recompute plan by the same procedure on raw K/V;
//   5. TrainPatchAligners: aligners for the patch layers;
//   6. MeasureFidelity: the result through the real codec (RunTransfer) on the held-out split;
//   7. FitFrontier (calib/frontier_fit.h): quality against bytes over per-layer ranks and code
//      precisions, stored in the artifact.
// Each stage fills its part of a typed CalibrationReport.
// Thread-safety: stateless functions.
#ifndef SCD_CALIB_CALIBRATOR_H_
#define SCD_CALIB_CALIBRATOR_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "calib/aligner_trainer.h"
#include "calib/calibration_report.h"
#include "calib/fidelity.h"
#include "calib/frontier_fit.h"
#include "calib/layer_policy.h"
#include "calib/paired_traces.h"
#include "codec/artifact.h"
#include "codec/reuse_translator.h"
#include "model/llama_model.h"
#include "tokenizer/tokenizer.h"

namespace scd {

struct CalibrationOptions {
  std::string data_path;  // calibration text
  int prefixes = 200;     // calibration prefixes
  int tokens = 128;       // tokens per prefix
  // Held-out split (the last 10 % of the text's documents) scoring layer choices.
  int heldout_windows = 24;
  int heldout_prefix = 64;
  int heldout_continuation = 32;
  // Reuse translators (K and V) and the hidden-state basis.
  FitMethod fit_method = FitMethod::kRrr;
  FitMethod hidden_basis = FitMethod::kRrr;
  int64_t rank_k = 0, rank_v = 0, rank_h = 0;  // 0: by energy
  double energy = 0.99;
  double ridge = 1e-4;
  bool per_head = true;  // one map per kv head (false: one map shared by a layer's heads)
  // Patch layers: fixed_k > 0 takes exactly that many, else the efficiency argmax in
  // [k_min, k_max].
  LayerPolicyOptions policy;
  int recompute_layers = 0;  // recompute baseline's budget; 0: as many as patch layers
  AlignerTrainOptions aligner;
  bool frontier = true;  // stage 7 (off: an artifact without a frontier, as before)
  FrontierFitOptions frontier_fit;
  int64_t reservoir_rows = 32768;  // attention-input pairs kept per layer for aligners
  // Also calibrate on sequences holding every non-special token id once (shuffled), so that
  // tokens the text never shows (byte-fallback tokens, rare pieces) still map well. Layer 0's
  // attention input depends on the token alone, so there nothing else can teach it.
  bool vocab_sweep = true;
  uint64_t seed = 0;
  bool progress = true;  // progress bars on stderr
};

struct CalibrationResult {
  Artifact artifact;
  CalibrationReport report;
};

absl::StatusOr<CalibrationResult> Calibrate(const LlamaModel& producer, const LlamaModel& consumer,
                                            const Tokenizer& tokenizer,
                                            const CalibrationOptions& options);

// What `scd-calib fit` prints: the layers' routes and ranks, the held-out fidelity, the time.
std::string FormatFitSummary(const std::string& artifact_path, const CalibrationResult& result);

// ---- the stages ----

struct CalibrationData {
  std::vector<std::vector<TokenId>> prefixes;  // calibration sequences, vocabulary sweep last
  std::vector<std::vector<TokenId>> heldout;   // held-out windows (prefix + continuation + 1)
};
absl::StatusOr<CalibrationData> LoadCalibrationData(const ModelConfig& producer,
                                                    const ModelConfig& consumer,
                                                    const Tokenizer& tokenizer,
                                                    const CalibrationOptions& options,
                                                    CalibrationDataReport* report);

// The held-out split alone, as a fit draws it (the last 10 % of the calibration text's
// documents): for a stage run on an existing artifact (scd-calib frontier).
absl::StatusOr<FidelityEvaluator> LoadHeldoutSplit(const LlamaModel& consumer,
                                                   const Tokenizer& tokenizer,
                                                   const CalibrationOptions& options);
// "held-out: last 10% of FILE, N windows of P+C tokens".
std::string HeldoutSplitName(const CalibrationOptions& options);

absl::Status CollectPairedTraces(const LlamaModel& producer, const LlamaModel& consumer,
                                 const std::vector<std::vector<TokenId>>& prefixes, bool progress,
                                 PairedTraces* traces);

// Translators into `artifact->layers` (one per layer, all reuse-routed), hidden-state bases
// into `bases`.
absl::Status FitTranslators(const PairedTraces& traces, const CalibrationOptions& options,
                            Artifact* artifact, std::vector<ReuseTranslator>* bases);

// Fills report->patch_policy and report->recompute_policy.
absl::Status SelectLayerPolicies(const LlamaModel& producer, const LlamaModel& consumer,
                                 const Artifact& artifact, const FidelityEvaluator& heldout,
                                 const CalibrationOptions& options, CalibrationReport* report);

// Routes the chosen patch layers to patch and trains their aligners (reports by layer).
absl::Status TrainPatchAligners(const LlamaModel& consumer, const PairedTraces& traces,
                                const std::vector<ReuseTranslator>& bases,
                                const std::vector<int>& patch_layers,
                                const CalibrationOptions& options, Artifact* artifact,
                                std::map<int, AlignerTrainReport>* reports);

absl::StatusOr<std::vector<ModeFidelity>> MeasureFidelity(const LlamaModel& producer,
                                                          const LlamaModel& consumer,
                                                          const Artifact& artifact,
                                                          const FidelityEvaluator& heldout);

}  // namespace scd

#endif  // SCD_CALIB_CALIBRATOR_H_
