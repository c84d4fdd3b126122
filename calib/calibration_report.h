// CalibrationReport: everything a fit measured and decided, as typed values. It is turned into
// JSON once, at the edge (calib/report_json.h), for the artifact's metadata and the command
// line; nothing parses it back.
// Thread-safety: plain value types.
#ifndef SCD_CALIB_CALIBRATION_REPORT_H_
#define SCD_CALIB_CALIBRATION_REPORT_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "calib/aligner_trainer.h"
#include "calib/fidelity.h"
#include "calib/layer_policy.h"
#include "codec/transfer_mode.h"

namespace scd {

struct CalibrationDataReport {
  std::string path;
  int prefixes = 0, tokens = 0;
  int vocab_sweep_sequences = 0;
  int heldout_windows = 0, heldout_prefix = 0, heldout_continuation = 0;
};

struct LayerRanks {
  int64_t k = 0, v = 0, h = 0;  // h = 0 where the layer has no patch aligner
};

struct ModeFidelity {
  TransferMode mode = TransferMode::kRaw;
  FidelityMetrics metrics;
  double payload_ratio = 0;  // bytes per token / raw f16 KV bytes per token
};

struct StageSeconds {
  double traces = 0, translators = 0, policy = 0, aligners = 0, fidelity = 0, frontier = 0;
  double total = 0;
};

struct CalibrationReport {
  CalibrationDataReport data;
  int64_t rows = 0;  // token rows seen per layer
  std::string fit_method, hidden_basis;
  double energy = 0, ridge = 0;
  bool per_head = true;
  std::vector<LayerRanks> ranks;
  AlignerShape aligner_shape;
  std::string aligner_loss;                    // "kv" or "hidden"
  std::map<int, AlignerTrainReport> aligners;  // by patch layer
  LayerPolicyResult patch_policy, recompute_policy;
  std::vector<ModeFidelity> fidelity;  // raw, reuse, scd on the held-out split
  std::string fidelity_split;          // what the held-out split is
  int frontier_evaluations = 0;        // held-out evaluations the frontier fit ran (0: none)
  uint64_t seed = 0;
  StageSeconds seconds;
};

}  // namespace scd

#endif  // SCD_CALIB_CALIBRATION_REPORT_H_
