// ServingMetrics: the public API's Prometheus families (scd:*, named after vLLM's), recorded from
// the events a node writes to its clients, so the coordinator and every consumer count the same
// way. Per Generate call a ServingMetrics::Call observes each event as it is written:
//   scd:time_to_first_token_seconds{mode}     Finished.timings.ttft, one per (request, target)
//   scd:e2e_request_latency_seconds{mode}     Finished.timings.total
//   scd:request_queue_time_seconds            Finished.timings.queue
//   scd:request_{prefill,encode,rebuild,patch}_time_seconds, scd:transfer_time_seconds
//                                             the stages of Timings (encode/transfer/rebuild/patch
//                                             only for a transfer: mode other than local)
//   scd:inter_token_latency_seconds           between a target's consecutive token events, as the
//                                             node writes them (one observation per event)
//   scd:transfer_bytes_total{mode}            sum of Finished.payload_bytes
//   scd:transfer_goodput_bytes_per_second     payload_bytes / timings.transfer, per transfer
//   scd:compression_ratio{mode}               16-bit KV bytes of the positions sent / payload
//                                             bytes (where the node knows its KV size: consumers)
//   scd:requests_total{mode,outcome}          per target: stop | length | cancelled | error
//   scd:request_failures_total{reason}        transport | deadline | cancel | refused | other:
//                                             Error events by code, and whole calls refused
//   scd:prompt_tokens_total, scd:generation_tokens_total
//   scd:num_requests_waiting / _running       targets before / after their first token
//   scd:stream_moves_total                    Moved events: streams continued on another
//                                             replica (the coordinator)
//   scd:transfer_fallbacks_total{mode}        targets Started in a transfer mode whose Finished
//                                             ran local: the transfer failed into the consumer's
//                                             own prefill (mode: the one begun)
//   scd:continued_tokens_checked_total{result} Finished.continuation: a moved or resumed greedy
//                                             stream's received ids, agreed | parted
//   scd:ttft_prediction_ratio{mode}           timings.ttft / Finished.predicted_ttft_us, where
//                                             auto mode predicted one (the coordinator)
// Node gauges from the node's Stats (SetNodeGauges) come from a collector at scrape time.
// Thread-safety: ServingMetrics is thread-safe; a Call is used by its call's thread.
#ifndef SCD_SERVING_SERVING_METRICS_H_
#define SCD_SERVING_SERVING_METRICS_H_

#include <functional>
#include <map>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "base/metrics.h"
#include "codec/transfer_mode.h"
#include "proto/node_speeds.h"
#include "scd/v1/control.pb.h"
#include "scd/v1/inference.pb.h"

namespace scd {

// Latency buckets (seconds) of every scd:*_seconds histogram: 1 ms .. 10 min.
const std::vector<double>& LatencyBuckets();

class ServingMetrics {
 public:
  // REQUIRES: `registry` outlives this. `kv_bytes_per_token`: the serving model's KV cache bytes
  // per prompt position at 16 bits (0: unknown, no compression ratio recorded).
  explicit ServingMetrics(MetricsRegistry* registry, uint64_t kv_bytes_per_token = 0);

  class Call {
   public:
    // `metrics` may be null: then Observe does nothing.
    explicit Call(ServingMetrics* metrics) : metrics_(metrics) {}
    ~Call();  // targets that never reached a terminal event leave the waiting/running gauges
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;
    void Observe(const v1::GenerateEvent& event, absl::Time now = absl::Now());

   private:
    enum class State { kWaiting, kRunning, kDone };
    struct Target {
      State state = State::kWaiting;
      absl::Time last_token = absl::InfinitePast();
      // The mode Started said; a transfer mode that Finished says ran local fell back.
      std::optional<TransferMode> started;
    };
    void Leave(Target& target);
    ServingMetrics* const metrics_;
    std::map<std::string, Target> targets_;
  };

  // One step of a consumer's scheduler (consumer/decode_scheduler.h): scd:batch_size (sequences
  // it advanced), scd:batch_tokens (rows: decodes and prefill tokens), scd:step_time_seconds.
  void ObserveStep(int64_t sequences, int64_t rows, double seconds);

  // A call that ended with a non-OK status before any event (refused as a whole).
  void CountRefused(const absl::Status& status);
  // The request failure reason of a gRPC status code: transport, deadline, cancel, refused, other.
  static const char* FailureReason(int grpc_code);

  MetricsRegistry* registry() const { return registry_; }
  // Every Finished observed also feeds `speeds` (a consumer's own speeds for its heartbeat).
  // Set before the node serves; REQUIRES: `speeds` outlives this.
  void set_speed_tracker(NodeSpeedTracker* speeds) { speeds_ = speeds; }

 private:
  void Finished(const v1::Finished& finished);
  void Failed(int grpc_code);

  MetricsRegistry* const registry_;
  const uint64_t kv_bytes_per_token_;
  Histogram& itl_;
  Histogram& queue_;
  Histogram& prefill_;
  Histogram& encode_;
  Histogram& transfer_;
  Histogram& rebuild_;
  Histogram& patch_;
  Histogram& goodput_;
  Counter& prompt_tokens_;
  Counter& generation_tokens_;
  Gauge& waiting_;
  Gauge& running_;
  Histogram& batch_size_;
  Histogram& batch_tokens_;
  Histogram& step_time_;
  NodeSpeedTracker* speeds_ = nullptr;
};

// A node's Stats as gauges and totals: scd:node_requests_active (NodeStats.running),
// scd:request_capacity, scd:open_transfer_sessions, scd:held_payload_bytes,
// scd:prefills_total, scd:prefill_tokens_total, scd:sessions_ended_total{state}, the prefix
// cache's scd:prefix_cache_{bytes,entries,hit_tokens_total,lookup_tokens_total}, and a consumer's
// batching and KV memory (after vLLM's num_requests_running/waiting and kv_cache_usage_perc):
// scd:num_sequences_running, scd:num_requests_queued, scd:kv_cache_{reserved,free,budget}_bytes,
// scd:kv_cache_usage_perc (reserved / budget), scd:scheduler_steps_total.
void SetNodeGauges(MetricsRegistry* registry, const v1::NodeStats& stats);
// Sets them at every scrape from `fill` (the node's Stats, without the secret check).
// REQUIRES: what `fill` reads outlives the registry's renders.
void AddNodeStatsCollector(MetricsRegistry* registry, std::function<void(v1::NodeStats*)> fill);

}  // namespace scd

#endif  // SCD_SERVING_SERVING_METRICS_H_
