#include "calib/layer_policy.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace scd {

absl::StatusOr<LayerPolicyResult> SelectLayers(int layers, const RestoredSetScore& score,
                                               const LayerPolicyOptions& options) {
  if (layers < 1) return absl::InvalidArgumentError("no layers to select from");
  const int k_max = std::min(options.fixed_k > 0 ? options.fixed_k : options.k_max, layers);
  const int k_min = std::max(1, std::min(options.k_min, k_max));
  LayerPolicyResult r;
  SCD_ASSIGN_OR_RETURN(r.base, score({}));
  // 1. Restore-one sensitivity (reported even when no layer is to be chosen).
  for (int l = 0; l < layers; ++l) {
    SCD_ASSIGN_OR_RETURN(double f, score({l}));
    r.restore_one.push_back(f - r.base);
  }
  if (options.fixed_k < 0) return r;  // no patch layers wanted
  std::vector<int> order(layers);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return r.restore_one[a] > r.restore_one[b]; });
  const int pool = options.pool > 0 ? std::min(options.pool, layers) : layers;
  r.pool.assign(order.begin(), order.begin() + std::max(pool, k_max));
  // 2. Forward greedy over the pool.
  std::vector<int> current;
  for (int step = 0; step < k_max; ++step) {
    int best = -1;
    double best_f = 0;
    for (int l : r.pool) {
      if (std::find(current.begin(), current.end(), l) != current.end()) continue;
      std::vector<int> trial = current;
      trial.push_back(l);
      SCD_ASSIGN_OR_RETURN(double f, score(trial));
      if (best < 0 || f > best_f) {
        best = l;
        best_f = f;
      }
    }
    if (best < 0) break;
    current.push_back(best);
    r.greedy_order.push_back(best);
    r.greedy_gain.push_back(best_f - r.base);
  }
  // 3. Budget: a fixed k, or the most efficient one.
  if (options.fixed_k > 0) {
    r.k = static_cast<int>(r.greedy_order.size());
  } else {
    double best_eff = -1e300;
    for (int k = k_min; k <= static_cast<int>(r.greedy_gain.size()); ++k) {
      const double eff = r.greedy_gain[k - 1] / (options.cost * k);
      if (eff > best_eff) {
        best_eff = eff;
        r.k = k;
      }
    }
  }
  r.chosen.assign(r.greedy_order.begin(), r.greedy_order.begin() + r.k);
  std::sort(r.chosen.begin(), r.chosen.end());
  return r;
}

}  // namespace scd
