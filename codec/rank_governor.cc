#include "codec/rank_governor.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace scd {
namespace {

// Drains shorter than this say more about scheduling than about the link.
constexpr absl::Duration kMinDrain = absl::Microseconds(500);

}  // namespace

RankGovernor::RankGovernor(AdaptBudget budget, std::vector<LayerBytes> planned, absl::Time start)
    : budget_(budget), planned_(std::move(planned)), deadline_(start + budget.deliver_within) {}

void RankGovernor::ObserveDrain(int64_t bytes, absl::Duration elapsed) {
  if (bytes <= 0 || elapsed < kMinDrain) return;
  // The latest drain, not an average: a link that just slowed down is the one the rest travels.
  measured_ = static_cast<double>(bytes) / absl::ToDoubleSeconds(elapsed);
}

double RankGovernor::ScaleFor(int layer, absl::Time now, int64_t inflight_bytes,
                              absl::Time compute_done, double layer_share_left) const {
  const double rate = goodput();
  if (!budget_.enabled() || rate <= 0 || !std::isfinite(rate)) return 1.0;
  double scalable = 0, fixed = 0;
  for (size_t l = static_cast<size_t>(std::max(layer, 0)); l < planned_.size(); ++l) {
    const double share =
        static_cast<int>(l) == layer ? std::clamp(layer_share_left, 0.0, 1.0) : 1.0;
    scalable += share * static_cast<double>(planned_[l].scalable);
    // A layer's fixed payload goes whole with its first piece: in flight once a piece went.
    if (share >= 1.0) fixed += static_cast<double>(planned_[l].fixed);
  }
  if (scalable <= 0) return 1.0;
  const absl::Time deadline = std::max(deadline_, compute_done);
  const double left_s = std::max(0.0, absl::ToDoubleSeconds(deadline - now));
  const double room = rate * left_s - static_cast<double>(inflight_bytes) - fixed;
  const double scale = room / scalable;
  if (!(scale < 1.0)) return 1.0;
  return std::max(scale, 1e-9);  // ScaledRank floors every code at rank 1
}

int64_t RankGovernor::ScaledRank(int64_t rank, double scale) {
  if (rank <= 0) return rank;
  if (scale >= 1.0) return rank;
  const int64_t scaled = static_cast<int64_t>(std::floor(static_cast<double>(rank) * scale));
  return std::clamp<int64_t>(scaled, 1, rank);
}

}  // namespace scd
