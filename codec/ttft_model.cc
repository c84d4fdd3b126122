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

double PipelineUs(const TtftInputs& in) {
  double after = 0;  // the rebuilds of layers l, l+1, ... in sequence
  double held = 0;
  for (size_t l = in.layer_codes_us.size(); l-- > 0;) {
    if (l < in.layer_rebuild_us.size()) after += std::max(0.0, in.layer_rebuild_us[l]);
    held = std::max(held, in.layer_codes_us[l] + std::max(0.0, in.latency_us) + after);
  }
  return held;
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
    const double rebuild = std::max(in.rebuild_us, PipelineUs(in));
    if (rebuild > held) {
      held = rebuild;
      out.bound_by = TtftStage::kRebuild;
    }
  }
  out.total_us = in.queue_us + held + in.decode_us;
  return out;
}

}  // namespace scd
