#include "codec/ttft_model.h"

#include <algorithm>
#include <cmath>

namespace scd {

const char* TtftStageName(TtftStage stage) {
  switch (stage) {
    case TtftStage::kPrefill:
      return "prefill";
    case TtftStage::kLink:
      return "link";
    case TtftStage::kRebuild:
      return "rebuild";
  }
  return "?";
}

double TransferUs(double bytes, double burst_bytes, double goodput_bytes_per_s, double latency_us) {
  const double shaped = std::max(0.0, bytes - std::max(0.0, burst_bytes));
  const bool limited = goodput_bytes_per_s > 0 && std::isfinite(goodput_bytes_per_s);
  return (limited ? shaped / goodput_bytes_per_s * 1e6 : 0) + std::max(0.0, latency_us);
}

TtftPrediction PredictTtft(const TtftInputs& in) {
  TtftPrediction out;
  double held = in.prefill_us;
  if (in.transfer) {
    out.transfer_us =
        TransferUs(in.payload_bytes, in.burst_bytes, in.goodput_bytes_per_s, in.latency_us);
    out.delivered_us = in.queue_us + std::max(in.prefill_us, out.transfer_us);
    const double link = out.transfer_us + in.last_rebuild_us;
    if (link > held) {
      held = link;
      out.bound_by = TtftStage::kLink;
    }
    if (in.rebuild_us > held) {
      held = in.rebuild_us;
      out.bound_by = TtftStage::kRebuild;
    }
  }
  out.total_us = in.queue_us + held + in.decode_us;
  return out;
}

}  // namespace scd
