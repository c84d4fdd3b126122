// The time-to-first-token model: what one way of getting a prompt's cache onto the consumer
// costs, from its stages' costs. One formula, shared by the coordinator's auto mode (predicting
// each choice from the nodes' measured speeds, coordinator/auto_choice.h) and the bandwidth
// sweep's lower bound (the same stages measured alone, bench/bandwidth_sweep.h):
//   local:    queue + prefill + decode
//   transfer: queue + max(prefill, transfer(bytes) + last rebuild, rebuild, pipeline) + decode
//   transfer(bytes) = max(0, bytes - burst) / goodput + latency
//   pipeline = max over layers l of (codes(l) + latency + the rebuilds of layers l, l+1, ...)
// Layer-wise streaming overlaps the producer's prefill, the link and the consumer's rebuild, so
// the slowest of the three holds the first token; what cannot overlap is the rebuild of the last
// chunk after it arrives (the link's term), and the rebuild as a whole (the consumer is not done
// before every layer is rebuilt, however the rebuild hides behind the transfer). Where the
// stages' per-layer times are known (the sweep measures them; auto mode's speeds have none, so
// its term is absent there), the pipeline term says what the layer order forces: layer l's codes
// exist only codes(l) into the producer's pass, and every rebuild they and the later layers' codes
// set off runs after that, one after another on the consumer's compute -- a patch layer's aligner
// late in the model cannot hide behind a prefill that has already ended.
// Torch-free. Thread-safety: pure functions.
#ifndef SCD_CODEC_TTFT_MODEL_H_
#define SCD_CODEC_TTFT_MODEL_H_

#include <vector>

namespace scd {

// The stage that holds the first token back.
enum class TtftStage { kPrefill, kLink, kRebuild };
const char* TtftStageName(TtftStage stage);  // prefill | link | rebuild

struct TtftInputs {
  bool transfer = false;  // the cache crosses the link (else the consumer prefills it itself)
  double queue_us = 0;    // waiting before the computing pass starts
  // The pass over the prompt's uncached positions: the consumer's own (local), or the
  // producer's prefill with its encoding (transfer).
  double prefill_us = 0;
  // Transfers only.
  double payload_bytes = 0;
  double burst_bytes = 0;          // bytes that pass before a shaped rate applies (token bucket)
  double goodput_bytes_per_s = 0;  // <= 0 or infinite: the link adds no time per byte
  double latency_us = 0;           // one way
  double rebuild_us = 0;           // the consumer's whole rebuild
  double last_rebuild_us = 0;      // the rebuild the last chunk sets off on arrival
  double decode_us = 0;            // the first decode step (0 where the prefill includes it)
  // Per layer, where known (else empty; then there is no pipeline term): when the producer's pass
  // had layer l's codes out, from its start, and the consumer's rebuild the chunks of layer l set
  // off (absent entries: none).
  std::vector<double> layer_codes_us;
  std::vector<double> layer_rebuild_us;
};

struct TtftPrediction {
  double total_us = 0;
  double transfer_us = 0;  // the link's term alone (0 for local)
  TtftStage bound_by = TtftStage::kPrefill;
  // Transfers: when the last byte is predicted to arrive, from the start (queue + the longer of
  // the prefill and the link's term): the deadline adaptation holds the link to
  // (codec/rank_governor.h); 0 for local.
  double delivered_us = 0;
};

// max(0, bytes - burst) / goodput + latency, microseconds.
double TransferUs(double bytes, double burst_bytes, double goodput_bytes_per_s, double latency_us);
// The pipeline term alone (0 without per-layer times).
double PipelineUs(const TtftInputs& inputs);
TtftPrediction PredictTtft(const TtftInputs& inputs);

}  // namespace scd

#endif  // SCD_CODEC_TTFT_MODEL_H_
