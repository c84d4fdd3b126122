#include "proto/node_speeds.h"

#include <algorithm>
#include <cmath>

#include "base/finish_reason.h"
#include "codec/transfer_mode.h"
#include "proto/wire_mode.h"

namespace scd {

void ToProto(const CostEstimate& estimate, v1::LinearCost* out) {
  out->set_fixed_us(estimate.fixed());
  out->set_per_unit_us(estimate.per_unit());
  out->set_samples(static_cast<uint32_t>(estimate.samples()));
}

double CostAt(const v1::LinearCost& cost, double n) {
  return cost.samples() == 0 ? 0 : cost.fixed_us() + cost.per_unit_us() * n;
}

v1::NodeSpeeds CheckedSpeeds(const v1::NodeSpeeds& speeds) {
  auto valid = [](const v1::LinearCost& c) {
    return std::isfinite(c.fixed_us()) && std::isfinite(c.per_unit_us()) && c.fixed_us() >= 0 &&
           c.per_unit_us() >= 0;
  };
  v1::NodeSpeeds out;
  if (valid(speeds.prefill())) *out.mutable_prefill() = speeds.prefill();
  if (valid(speeds.rebuild())) *out.mutable_rebuild() = speeds.rebuild();
  if (valid(speeds.first_decode())) *out.mutable_first_decode() = speeds.first_decode();
  if (valid(speeds.local_itl())) *out.mutable_local_itl() = speeds.local_itl();
  if (valid(speeds.rebuild_itl())) *out.mutable_rebuild_itl() = speeds.rebuild_itl();
  if (valid(speeds.busy_prefill())) *out.mutable_busy_prefill() = speeds.busy_prefill();
  return out;
}

void NodeSpeedTracker::ObservePrefill(int64_t computed_tokens, double us) {
  absl::MutexLock lock(&mu_);
  prefill_.Add(static_cast<double>(computed_tokens), us);
}

void NodeSpeedTracker::ObserveFinished(const v1::Finished& finished) {
  if (ParseFinishReason(finished.reason()) == FinishReason::kCancelled)
    return;  // cut short: not the work's cost
  const v1::Timings& t = finished.timings();
  const int64_t cached = std::min(finished.consumer_cached_tokens(), finished.prompt_tokens());
  const double computed = static_cast<double>(finished.prompt_tokens()) - cached;
  absl::MutexLock lock(&mu_);
  const TransferMode mode = RanMode(finished);
  if (mode == TransferMode::kLocal) {
    if (t.ttft() >= t.queue()) prefill_.Add(computed, static_cast<double>(t.ttft() - t.queue()));
  } else if (mode == TransferMode::kScd) {
    rebuild_.Add(computed, static_cast<double>(t.rebuild() + t.patch()));
    first_decode_.Add(finished.prompt_tokens(), static_cast<double>(t.first_decode()));
  }
}

void SetPerTokenCost(double us_per_token, v1::LinearCost* out) {
  if (!(us_per_token > 0) || !std::isfinite(us_per_token)) return;
  out->set_fixed_us(0);
  out->set_per_unit_us(us_per_token);
  out->set_samples(1);
}

v1::NodeSpeeds NodeSpeedTracker::Report() const {
  v1::NodeSpeeds speeds;
  absl::MutexLock lock(&mu_);
  if (prefill_.known()) ToProto(prefill_, speeds.mutable_prefill());
  if (rebuild_.known()) ToProto(rebuild_, speeds.mutable_rebuild());
  if (first_decode_.known()) ToProto(first_decode_, speeds.mutable_first_decode());
  return speeds;
}

}  // namespace scd
