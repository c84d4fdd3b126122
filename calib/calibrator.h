// Calibrate(): the offline fit of one producer -> consumer pair (scd-calib fit).
//   1. paired prefills of both models on calibration prefixes, streamed into PairedTraces;
//   2. reuse translators for K and V of every layer, a hidden-state basis per layer;
//   3. patch layers by the paper's policy, F = -KL(oracle || mode) on a held-out split of the
//      calibration text; the DroidSpeak-style recompute plan by the same procedure on raw K/V;
//   4. aligners for the patch layers; 5. the fidelity of the result on the held-out split.
// Thread-safety: stateless function.
#ifndef SCD_CALIB_CALIBRATOR_H_
#define SCD_CALIB_CALIBRATOR_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "calib/aligner_trainer.h"
#include "calib/layer_policy.h"
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
  int64_t reservoir_rows = 32768;  // attention-input pairs kept per layer for aligners
  // Also calibrate on sequences holding every non-special token id once (shuffled), so that
  // tokens the text never shows (byte-fallback tokens, rare pieces) still map well. Layer 0's
  // attention input depends on the token alone, so there nothing else can teach it.
  bool vocab_sweep = true;
  uint64_t seed = 0;
  bool progress = true;  // progress bars on stderr
};

absl::StatusOr<Artifact> Calibrate(const LlamaModel& producer, const LlamaModel& consumer,
                                   const Tokenizer& tokenizer, const CalibrationOptions& options);

}  // namespace scd

#endif  // SCD_CALIB_CALIBRATOR_H_
