// FitFrontier (scd-calib fit's last stage, and `scd-calib frontier` for an existing artifact):
// the pair's quality-against-bytes frontier over per-layer code ranks and code precision.
//   1. Sensitivities, measured: the held-out KL of scd with every code at full rank except one
//      slot (a layer's key, value or hidden code) lowered along its rank ladder, and of the full
//      ranks at each precision.
//   2. A greedy allocation per precision under an additive model of those sensitivities: from
//      the full ranks, repeatedly lower the slot whose next step loses the least predicted KL
//      per byte saved (water-filling in reverse), so each precision's path is nested.
//   3. Points spread along each path measured through the real codec (KL, bytes, encode and
//      rebuild time per token), and the measured points that no other point beats in both bytes
//      and KL kept — plus the fitted configuration (full ranks, f16) as the top point always.
// Thread-safety: stateless functions (they run the models).
#ifndef SCD_CALIB_FRONTIER_FIT_H_
#define SCD_CALIB_FRONTIER_FIT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "calib/fidelity.h"
#include "codec/artifact.h"
#include "codec/frontier.h"
#include "model/llama_model.h"

namespace scd {

struct FrontierFitOptions {
  std::vector<WireDtype> dtypes = {WireDtype::kF16, WireDtype::kInt8, WireDtype::kInt4};
  // Each slot's ladder: its full rank times 1, 3/4, 1/2, 1/4, 1/8, ... (rounded, at least 1,
  // distinct), `ladder_steps` rungs at most.
  int ladder_steps = 4;
  // Points measured along each precision's greedy path (its full-rank start included).
  int points_per_dtype = 8;
  // The recommended point: the cheapest whose KL is at most this times the full-rank f16 KL.
  double recommend_kl_ratio = 1.25;
  bool progress = true;
};

// One step of a greedy path, before it is measured.
struct AllocatedPoint {
  std::vector<int64_t> rank_k, rank_v, rank_h;
  double predicted_kl = 0;
  double bytes_per_token = 0;  // the model's element bytes (scales excluded)
};

// What FitFrontier measured on the way, for reports and tests.
struct FrontierFitTrace {
  double full_kl = 0;  // full ranks, f16
  // Every measured point, before the Pareto filter (the frontier is a subset).
  std::vector<FrontierPoint> measured;
  double seconds = 0;
  int evaluations = 0;
};

// The rank ladder of a code of full rank `full`.
std::vector<int64_t> RankLadder(int64_t full, int steps);

// REQUIRES: `heldout` built on `consumer`; `artifact` fitted for the pair.
absl::StatusOr<Frontier> FitFrontier(const LlamaModel& producer, const LlamaModel& consumer,
                                     const Artifact& artifact, const FidelityEvaluator& heldout,
                                     const FrontierFitOptions& options,
                                     FrontierFitTrace* trace = nullptr);

// The frontier as a table (one row per point, the recommended one marked).
std::string FormatFrontier(const Frontier& frontier);

}  // namespace scd

#endif  // SCD_CALIB_FRONTIER_FIT_H_
