#include "coordinator/producer_takeover.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "proto/node_speeds.h"

namespace scd::coordinator {
namespace {

// The rest of the transfer from another producer: layers [k, L) of the plan.
TtftPrediction PredictRest(const AutoInputs& in, const v1::TransferLost& lost) {
  const double layers = std::max<double>(1, lost.layers());
  const double left = std::max(0.0, layers - lost.layers_rebuilt()) / layers;
  const double sent = std::max(0.0, in.prompt_tokens - 1 - static_cast<double>(lost.token_begin()));
  TtftInputs t;
  t.transfer = true;
  t.prefill_us = CostAt(PrefillOf(in.producer, in.consumer), std::max(1.0, in.prompt_tokens));
  t.queue_us = in.producer_queue * t.prefill_us;
  t.payload_bytes = static_cast<double>(lost.bytes_left());
  t.goodput_bytes_per_s = in.goodput_bytes_per_s;
  t.latency_us = in.latency_us;
  t.rebuild_us =
      in.consumer.rebuild().samples() > 0 ? left * CostAt(in.consumer.rebuild(), sent) : 0;
  t.last_rebuild_us = t.rebuild_us / std::max(1.0, layers - lost.layers_rebuilt());
  t.decode_us = CostAt(in.consumer.first_decode(), in.prompt_tokens);
  return PredictTtft(t);
}

}  // namespace

TakeoverDecision ChooseTakeover(const AutoInputs& in, const v1::TransferLost& lost,
                                bool fallback_allowed) {
  TakeoverDecision d;
  const std::string rest =
      absl::StrFormat("layers %d-%d (%d bytes) from another producer", lost.layers_rebuilt(),
                      lost.layers() - 1, lost.bytes_left());
  if (!CanPredict(in)) {
    d.take_over = true;
    d.reason = absl::StrCat(rest, ": no speeds measured, the codes as routed");
    return d;
  }
  AutoInputs whole = in;
  whole.consumer_cached_tokens = 0;  // the fallback drops what was rebuilt
  d.rest = PredictRest(in, lost);
  d.local = PredictLocal(whole);
  d.take_over = !fallback_allowed || d.rest.total_us <= d.local.total_us;
  d.reason = absl::StrFormat("%s predicted %.1f ms, the consumer's own prefill %.1f ms%s", rest,
                             d.rest.total_us / 1e3, d.local.total_us / 1e3,
                             fallback_allowed ? "" : " (the request forbids the fallback)");
  return d;
}

}  // namespace scd::coordinator
