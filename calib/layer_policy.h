// Patch-layer selection, the paper's appendix A. F(S) scores a consumer whose layers in S are
// restored to the oracle and all others reuse-decoded (higher is better, e.g. -KL):
//   1. restore-one sensitivity  dF_l = F({l}) - F({}), keep the top-M layers as the pool;
//   2. forward greedy over the pool: S_t = S_{t-1} + argmax_l F(S_{t-1} + {l});
//   3. k* = argmax over k in [k_min, k_max] of dF(S_k) / (c k)  (or a fixed k).
// Thread-safety: stateless function.
#ifndef SCD_CALIB_LAYER_POLICY_H_
#define SCD_CALIB_LAYER_POLICY_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace scd {

struct LayerPolicyOptions {
  int k_min = 1;
  int k_max = 3;
  int pool = 0;       // candidate pool size M; 0 = every layer
  double cost = 1.0;  // per-layer patch cost c
  int fixed_k = 0;    // > 0: take S_k for this k instead of the efficiency argmax; < 0: none
};

struct LayerPolicyResult {
  double base = 0;                  // F({})
  std::vector<double> restore_one;  // dF_l per layer
  std::vector<int> pool;
  std::vector<int> greedy_order;    // layer added at step t
  std::vector<double> greedy_gain;  // dF(S_t) after step t
  int k = 0;
  std::vector<int> chosen;  // S_k, sorted
};

using RestoredSetScore = std::function<absl::StatusOr<double>(const std::vector<int>& restored)>;

absl::StatusOr<LayerPolicyResult> SelectLayers(int layers, const RestoredSetScore& score,
                                               const LayerPolicyOptions& options);

}  // namespace scd

#endif  // SCD_CALIB_LAYER_POLICY_H_
