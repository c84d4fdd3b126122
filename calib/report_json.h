// JSON at the edge: the one place calibration and evaluation reports become JSON (artifact
// metadata, `scd-calib eval --json`, test messages). Keys are stable: tools and notebooks read
// them.
// Thread-safety: stateless functions.
#ifndef SCD_CALIB_REPORT_JSON_H_
#define SCD_CALIB_REPORT_JSON_H_

#include <nlohmann/json.hpp>

#include "calib/aligner_trainer.h"
#include "calib/calibration_report.h"
#include "calib/evaluation.h"
#include "calib/fidelity.h"
#include "calib/layer_policy.h"

namespace scd {

nlohmann::json ToJson(const FidelityMetrics& metrics);
nlohmann::json ToJson(const LayerPolicyResult& policy);
nlohmann::json ToJson(const AlignerTrainReport& report);

// `scd-calib eval --json`: `context` (producer, consumer, data, ...) plus {"modes": {name: metrics
// with payload_ratio and raw_f16_bytes_per_token}}.
nlohmann::json ModeResultsJson(const std::vector<ModeResult>& results, nlohmann::json context);

// The artifact's three metadata documents.
nlohmann::json CalibrationJson(const CalibrationReport& report);  // scd.calibration
nlohmann::json PolicyJson(const CalibrationReport& report);       // scd.policy
nlohmann::json FidelityJson(const CalibrationReport& report);     // scd.fidelity

}  // namespace scd

#endif  // SCD_CALIB_REPORT_JSON_H_
