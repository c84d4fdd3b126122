// RankGovernor (torch-free): adapts a transfer's nested code ranks while it travels. The plan
// fixes, per layer, the bytes its codes carry at the chosen point; a budget says by when the last
// byte should be delivered (from the producer's start) and what goodput the plan assumed. Before
// each piece of a layer goes out (producer/adaptive_sender.h) the producer asks for a scale: the
// largest share of the planned ranks whose remaining bytes -- this layer's positions still to
// go and every later layer's, plus what is still in flight -- drain
// by the deadline at the goodput measured now (the drains the producer observes while the link
// holds it back), the planned goodput until one is measured. A running budget (time left against
// bytes left), not a fixed share per layer: a layer sent at full rank while the link kept up costs
// the later ones nothing, and a link that recovers gets the ranks back. Layers whose payload
// cannot shrink (raw K/V, residual streams) count as fixed bytes.
// Thread-safety: not thread-safe; one per transfer target, used by the producer's pass.
#ifndef SCD_CODEC_RANK_GOVERNOR_H_
#define SCD_CODEC_RANK_GOVERNOR_H_

#include <cstdint>
#include <vector>

#include "absl/time/time.h"

namespace scd {

struct AdaptBudget {
  // The last byte delivered this long after the producer's start; zero: no adaptation.
  absl::Duration deliver_within = absl::ZeroDuration();
  // The goodput the plan assumed, bytes per second (0: unknown, wait for a measurement).
  double planned_bytes_per_s = 0;
  bool enabled() const { return deliver_within > absl::ZeroDuration(); }
};

// A layer's planned bytes: those that scale with the code ranks and those that do not.
struct LayerBytes {
  int64_t scalable = 0;
  int64_t fixed = 0;
};

class RankGovernor {
 public:
  RankGovernor(AdaptBudget budget, std::vector<LayerBytes> planned, absl::Time start);

  // `bytes` left the in-flight window over `elapsed` while the sender waited on the link (so the
  // link was busy throughout): the goodput now. Short or empty drains are ignored.
  void ObserveDrain(int64_t bytes, absl::Duration elapsed);
  // The share of its planned ranks layer `layer` goes at, in (0, 1]: 1 while the budget holds or
  // no goodput is known. `inflight_bytes`: sent, not yet delivered. `compute_done`: when the
  // producer's pass is expected to have made the last layer (InfinitePast: unknown); a pass
  // later than the budget moves the deadline with it -- the link is not what is behind then,
  // and lower ranks would buy nothing. `layer_share_left`: the share of layer `layer`'s positions
  // not yet handed over (a layer that goes in pieces; its earlier pieces are in flight).
  double ScaleFor(int layer, absl::Time now, int64_t inflight_bytes,
                  absl::Time compute_done = absl::InfinitePast(),
                  double layer_share_left = 1.0) const;
  // The deadline the budget sets.
  absl::Time deadline() const { return deadline_; }
  // Bytes per second the next scale assumes (0: none known).
  double goodput() const { return measured_ > 0 ? measured_ : budget_.planned_bytes_per_s; }

  // A planned rank at `scale`: floor(rank * scale), at least 1 (0 stays 0).
  static int64_t ScaledRank(int64_t rank, double scale);

 private:
  AdaptBudget budget_;
  std::vector<LayerBytes> planned_;
  absl::Time deadline_;
  double measured_ = 0;
};

}  // namespace scd

#endif  // SCD_CODEC_RANK_GOVERNOR_H_
