// FitFrontier (scd-calib fit's last stage, and `scd-calib frontier` for an existing artifact):
// the pair's quality-against-bytes frontier over per-layer code ranks and code precision.
//   0. Per-head ranks (FoldHeadRanks, before it): each reuse layer's per-head K and V maps
//      folded into one map (ReuseTranslator::FoldHeads) whose columns run across heads in the
//      order greedy marginal gain chooses from each head's measured KL down its own ladder
//      (the cheapest KL per column dropped goes last). A layer's rank on the frontier is then a
//      count of columns over every head, and lowering it lowers the heads that cost least.
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
  // FoldHeadRanks before the frontier (scd-calib's --no-frontier-head-ranks keeps one rank per
  // layer for every head).
  bool head_ranks = true;
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
  // FoldHeadRanks: the codes folded, its held-out evaluations and time.
  int folded_codes = 0;
  int head_evaluations = 0;
  double head_seconds = 0;
};

// The rank ladder of a code of full rank `full`.
std::vector<int64_t> RankLadder(int64_t full, int steps);

// The column order of one folded code from its heads' measured losses (`loss[h][i]`: the KL
// increase with head h alone at ladder[i]; non-falling): from every head at full rank, the rung
// of least KL per column removed goes first (ties: the head with more columns left); the order
// lists the columns most important first, each head's in its own order. Size: heads * ladder[0].
std::vector<int> GreedyHeadOrder(const std::vector<int64_t>& ladder,
                                 const std::vector<std::vector<double>>& loss);

// Step 0: folds every reuse layer's per-head K and V maps of `*artifact` (no-op where there are
// none, or one kv head). The folded artifact sends the same codes at full rank.
// REQUIRES: `heldout` built on `consumer`; `artifact` fitted for the pair.
absl::Status FoldHeadRanks(const LlamaModel& producer, const LlamaModel& consumer,
                           Artifact* artifact, const FidelityEvaluator& heldout,
                           const FrontierFitOptions& options, FrontierFitTrace* trace = nullptr);

// REQUIRES: `heldout` built on `consumer`; `artifact` fitted for the pair.
absl::StatusOr<Frontier> FitFrontier(const LlamaModel& producer, const LlamaModel& consumer,
                                     const Artifact& artifact, const FidelityEvaluator& heldout,
                                     const FrontierFitOptions& options,
                                     FrontierFitTrace* trace = nullptr);

// What scd-calib fit and frontier run: FoldHeadRanks where options.head_ranks, then FitFrontier,
// stored in artifact->frontier. `trace` counts both stages' evaluations.
absl::Status FitFrontierInto(const LlamaModel& producer, const LlamaModel& consumer,
                             Artifact* artifact, const FidelityEvaluator& heldout,
                             const FrontierFitOptions& options, FrontierFitTrace* trace = nullptr);

// The frontier as a table (one row per point, the recommended one marked).
std::string FormatFrontier(const Frontier& frontier);

}  // namespace scd

#endif  // SCD_CALIB_FRONTIER_FIT_H_
