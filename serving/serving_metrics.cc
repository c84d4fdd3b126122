#include "serving/serving_metrics.h"

#include <grpcpp/support/status_code_enum.h>

#include <algorithm>
#include <cmath>

#include "codec/transfer_mode.h"
#include "proto/wire_mode.h"

namespace scd {
namespace {

// Help texts of the families made on first use (the first Get* names the family's help).
constexpr char kBytesHelp[] = "Code payload bytes received by consumers (Finished.payload_bytes)";
constexpr char kTtftHelp[] = "Request received to first token sent (Timings.ttft)";
constexpr char kE2eHelp[] = "Request received to Finished (Timings.total)";
constexpr char kRequestsHelp[] = "Request targets ended, by mode and outcome";
constexpr char kMovesHelp[] =
    "Streams moved to another replica of their target (GenerateEvent.Moved)";
constexpr char kTakeoversHelp[] =
    "Transfers another producer took over after theirs was lost (Finished.takeovers)";
constexpr char kFallbacksHelp[] =
    "Request targets begun in a transfer mode that ended on the consumer's own prefill (the "
    "transfer failed: producer lost, corrupt codes), by the mode begun";
constexpr char kFailuresHelp[] = "Failed request targets and calls refused as a whole, by reason";

double Seconds(uint64_t micros) { return static_cast<double>(micros) / 1e6; }

Histogram& Seconds(MetricsRegistry* r, const char* name, const char* help,
                   const MetricLabels& labels = {}) {
  return r->GetHistogram(name, help, LatencyBuckets(), labels);
}

}  // namespace

const std::vector<double>& LatencyBuckets() {
  static const std::vector<double> kBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075,
                                               0.1,   0.25,   0.5,   0.75, 1.0,   2.5,  5.0,
                                               10.0,  20.0,   40.0,  80.0, 160.0, 600.0};
  return kBuckets;
}

ServingMetrics::ServingMetrics(MetricsRegistry* registry, uint64_t kv_bytes_per_token)
    : registry_(registry),
      kv_bytes_per_token_(kv_bytes_per_token),
      itl_(Seconds(registry, "scd:inter_token_latency_seconds",
                   "Time between a target's consecutive token events")),
      queue_(Seconds(registry, "scd:request_queue_time_seconds",
                     "Admission to start of prefill (Timings.queue)")),
      prefill_(Seconds(registry, "scd:request_prefill_time_seconds",
                       "Forward pass over the prompt: the producer's, or the consumer's own in "
                       "local mode (Timings.prefill)")),
      encode_(Seconds(registry, "scd:request_encode_time_seconds",
                      "Producer encoding codes, summed over layers (Timings.encode)")),
      transfer_(Seconds(registry, "scd:transfer_time_seconds",
                        "First code byte sent to last received (Timings.transfer)")),
      rebuild_(Seconds(registry, "scd:request_rebuild_time_seconds",
                       "Consumer rebuilding its KV cache from codes (Timings.rebuild)")),
      patch_(Seconds(registry, "scd:request_patch_time_seconds",
                     "Patch aligners, summed (Timings.patch)")),
      goodput_(registry->GetHistogram("scd:transfer_goodput_bytes_per_second",
                                      "Payload bytes over transfer time, per transfer",
                                      ExponentialBuckets(1e5, 4, 12))),
      prompt_tokens_(registry->GetCounter("scd:prompt_tokens_total",
                                          "Prompt tokens of finished requests (per target)")),
      generation_tokens_(
          registry->GetCounter("scd:generation_tokens_total", "Tokens generated (per target)")),
      waiting_(registry->GetGauge("scd:num_requests_waiting",
                                  "Request targets admitted that have not sent a token yet "
                                  "(queue, prefill, transfer, rebuild)")),
      running_(registry->GetGauge("scd:num_requests_running", "Request targets generating tokens")),
      batch_size_(registry->GetHistogram("scd:batch_size",
                                         "Sequences one scheduler step advanced together",
                                         ExponentialBuckets(1, 2, 10))),
      batch_tokens_(registry->GetHistogram(
          "scd:batch_tokens", "Rows of one scheduler step: decodes and prefill chunk tokens",
          ExponentialBuckets(1, 2, 14))),
      step_time_(registry->GetHistogram("scd:step_time_seconds",
                                        "Time of one scheduler step's batched forward",
                                        ExponentialBuckets(1e-4, 2, 16))) {
  // Every failure reason and the whole families exist from the start (0, not absent).
  for (const char* reason : {"transport", "deadline", "cancel", "refused", "other"}) {
    registry->GetCounter("scd:request_failures_total", kFailuresHelp, {{"reason", reason}});
  }
  registry->GetCounter("scd:stream_moves_total", kMovesHelp, {});
  registry->GetCounter("scd:transfer_takeovers_total", kTakeoversHelp, {});
  for (TransferMode mode : {TransferMode::kScd, TransferMode::kRaw, TransferMode::kInt4,
                            TransferMode::kReuse, TransferMode::kRecompute}) {
    registry->GetCounter("scd:transfer_fallbacks_total", kFallbacksHelp,
                         {{"mode", TransferModeName(mode)}});
  }
}

const char* ServingMetrics::FailureReason(int grpc_code) {
  switch (grpc_code) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::ABORTED:
    case grpc::StatusCode::DATA_LOSS:
    case grpc::StatusCode::INTERNAL:
      return "transport";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "deadline";
    case grpc::StatusCode::CANCELLED:
      return "cancel";
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::OUT_OF_RANGE:
    case grpc::StatusCode::NOT_FOUND:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED:
      return "refused";
    default:
      return "other";
  }
}

void ServingMetrics::Failed(int grpc_code) {
  registry_
      ->GetCounter("scd:request_failures_total", kFailuresHelp,
                   {{"reason", FailureReason(grpc_code)}})
      .Increment();
}

void ServingMetrics::CountRefused(const absl::Status& status) {
  if (!status.ok()) Failed(static_cast<int>(status.code()));
}

void ServingMetrics::Finished(const v1::Finished& f) {
  const v1::Timings& t = f.timings();
  const TransferMode ran = RanMode(f);
  const MetricLabels mode = {{"mode", TransferModeName(ran)}};
  Seconds(registry_, "scd:time_to_first_token_seconds", kTtftHelp, mode).Observe(Seconds(t.ttft()));
  Seconds(registry_, "scd:e2e_request_latency_seconds", kE2eHelp, mode).Observe(Seconds(t.total()));
  queue_.Observe(Seconds(t.queue()));
  prefill_.Observe(Seconds(t.prefill()));
  if (ran != TransferMode::kLocal) {
    encode_.Observe(Seconds(t.encode()));
    transfer_.Observe(Seconds(t.transfer()));
    rebuild_.Observe(Seconds(t.rebuild()));
    patch_.Observe(Seconds(t.patch()));
    if (f.payload_bytes() > 0 && t.transfer() > 0) {
      goodput_.Observe(static_cast<double>(f.payload_bytes()) / Seconds(t.transfer()));
    }
    const uint64_t sent =
        f.prompt_tokens() - std::min(f.prompt_tokens(), f.consumer_cached_tokens());
    if (kv_bytes_per_token_ > 0 && f.payload_bytes() > 0 && sent > 0) {
      registry_
          ->GetHistogram("scd:compression_ratio",
                         "16-bit KV cache bytes of the positions sent over the code payload bytes",
                         ExponentialBuckets(1, 2, 12), mode)
          .Observe(static_cast<double>(sent * kv_bytes_per_token_) /
                   static_cast<double>(f.payload_bytes()));
    }
  }
  registry_->GetCounter("scd:transfer_bytes_total", kBytesHelp, mode)
      .Increment(static_cast<double>(f.payload_bytes()));
  registry_
      ->GetCounter("scd:requests_total", kRequestsHelp,
                   {{"mode", TransferModeName(ran)}, {"outcome", f.reason()}})
      .Increment();
  prompt_tokens_.Increment(f.prompt_tokens());
  generation_tokens_.Increment(f.output_tokens());
  registry_->GetCounter("scd:transfer_takeovers_total", kTakeoversHelp, {})
      .Increment(f.takeovers());
  if (f.has_continuation()) {
    const v1::ContinuationChecked& c = f.continuation();
    constexpr char kHelp[] =
        "received ids of moved or resumed greedy streams checked by the new replica's prefill: "
        "agreed (its pick, or within the near-tie bound) or parted";
    registry_->GetCounter("scd:continued_tokens_checked_total", kHelp, {{"result", "agreed"}})
        .Increment(c.checked() - std::min(c.checked(), c.parted()));
    registry_->GetCounter("scd:continued_tokens_checked_total", kHelp, {{"result", "parted"}})
        .Increment(c.parted());
  }
  if (f.predicted_ttft_us() > 0 && t.ttft() > 0) {
    registry_
        ->GetHistogram("scd:ttft_prediction_ratio",
                       "time to first token over what auto mode predicted when it chose",
                       ExponentialBuckets(0.125, std::sqrt(2.0), 13), mode)
        .Observe(static_cast<double>(t.ttft()) / static_cast<double>(f.predicted_ttft_us()));
  }
  if (speeds_ != nullptr) speeds_->ObserveFinished(f);
}

void ServingMetrics::Call::Leave(Target& target) {
  if (target.state == State::kWaiting) metrics_->waiting_.Add(-1);
  if (target.state == State::kRunning) metrics_->running_.Add(-1);
  target.state = State::kDone;
}

void ServingMetrics::Call::Observe(const v1::GenerateEvent& event, absl::Time now) {
  if (metrics_ == nullptr) return;
  auto [it, inserted] = targets_.try_emplace(event.target());
  Target& target = it->second;
  if (inserted) metrics_->waiting_.Add(1);
  if (target.state == State::kDone) return;
  switch (event.event_case()) {
    case v1::GenerateEvent::kToken:
      if (target.state == State::kWaiting) {
        metrics_->waiting_.Add(-1);
        metrics_->running_.Add(1);
        target.state = State::kRunning;
      } else if (target.last_token != absl::InfinitePast()) {
        metrics_->itl_.Observe(absl::ToDoubleSeconds(now - target.last_token));
      }
      target.last_token = now;
      break;
    case v1::GenerateEvent::kStarted:
      target.started = RanMode(event.started());
      break;
    case v1::GenerateEvent::kFinished:
      metrics_->Finished(event.finished());
      if (target.started && *target.started != TransferMode::kLocal &&
          RanMode(event.finished(), *target.started) == TransferMode::kLocal) {
        metrics_->registry_
            ->GetCounter("scd:transfer_fallbacks_total", kFallbacksHelp,
                         {{"mode", TransferModeName(*target.started)}})
            .Increment();
      }
      Leave(target);
      break;
    case v1::GenerateEvent::kMoved:
      metrics_->registry_->GetCounter("scd:stream_moves_total", kMovesHelp, {}).Increment();
      break;
    case v1::GenerateEvent::kError:
      metrics_->registry_
          ->GetCounter("scd:requests_total", kRequestsHelp, {{"mode", ""}, {"outcome", "error"}})
          .Increment();
      metrics_->Failed(event.error().code());
      Leave(target);
      break;
    default:
      break;
  }
}

ServingMetrics::Call::~Call() {
  if (metrics_ == nullptr) return;
  for (auto& [name, target] : targets_) Leave(target);
}

void ServingMetrics::ObserveStep(int64_t sequences, int64_t rows, double seconds) {
  batch_size_.Observe(static_cast<double>(sequences));
  batch_tokens_.Observe(static_cast<double>(rows));
  step_time_.Observe(seconds);
}

void SetNodeGauges(MetricsRegistry* r, const v1::NodeStats& stats) {
  r->GetGauge("scd:node_requests_active",
              "Producer: prefills running; consumer: admitted requests; coordinator: calls")
      .Set(stats.running());
  r->GetGauge("scd:request_capacity", "Requests a consumer runs at once").Set(stats.capacity());
  r->GetGauge("scd:open_transfer_sessions", "Transfer sessions not yet ended")
      .Set(stats.open_sessions());
  r->GetGauge("scd:held_payload_bytes",
              "Producer: code bytes handed to the transport and not yet released")
      .Set(static_cast<double>(stats.held_payload_bytes()));
  r->GetCounter("scd:prefills_total", "Producer prefills run (a fan-out runs one)")
      .SetTotal(static_cast<double>(stats.prefills()));
  r->GetCounter("scd:prefill_tokens_total", "Prompt positions the producer's passes computed")
      .SetTotal(static_cast<double>(stats.prefill_tokens()));
  for (const auto& [state, count] : stats.ended()) {
    r->GetCounter("scd:sessions_ended_total",
                  "Transfer sessions and requests ended, by terminal state", {{"state", state}})
        .SetTotal(static_cast<double>(count));
  }
  if (stats.kv_budget_bytes() > 0) {  // a consumer
    const double budget = static_cast<double>(stats.kv_budget_bytes());
    const double reserved = static_cast<double>(stats.kv_reserved_bytes());
    r->GetGauge("scd:num_sequences_running",
                "Sequences in the consumer's batch (prefilling or "
                "decoding)")
        .Set(stats.sequences());
    r->GetGauge("scd:num_requests_queued", "Requests waiting for KV memory (admission queue)")
        .Set(stats.queued());
    r->GetGauge("scd:kv_cache_reserved_bytes",
                "KV bytes reserved by admitted requests (prompt + max_tokens each)")
        .Set(reserved);
    r->GetGauge("scd:kv_cache_free_bytes", "KV bytes not reserved")
        .Set(std::max(0.0, budget - reserved));
    r->GetGauge("scd:kv_cache_budget_bytes", "The consumer's KV memory (--kv-cache-mb)")
        .Set(budget);
    r->GetGauge("scd:kv_cache_usage_perc", "Reserved KV bytes over the budget (0..1)")
        .Set(reserved / budget);
    r->GetCounter("scd:scheduler_steps_total", "Batched steps the consumer's scheduler ran")
        .SetTotal(static_cast<double>(stats.steps()));
    const char* itl_help =
        "Inter-token latency a prompt token of this work costs each decoding sequence, lately "
        "(0: not seen)";
    r->GetGauge("scd:prompt_itl_cost_seconds", itl_help, {{"work", "local_prefill"}})
        .Set(stats.local_itl_us_per_token() / 1e6);
    r->GetGauge("scd:prompt_itl_cost_seconds", itl_help, {{"work", "rebuild"}})
        .Set(stats.rebuild_itl_us_per_token() / 1e6);
  }
  if (stats.has_ejection()) {  // a coordinator (coordinator/node_ejection.h)
    const v1::EjectionStats& e = stats.ejection();
    r->GetGauge("scd:nodes_out", "Nodes out of routing on this coordinator after a failed call")
        .Set(stats.nodes_out());
    r->GetCounter("scd:node_ejections_total",
                  "Nodes this coordinator took out of routing on its own evidence")
        .SetTotal(static_cast<double>(e.ejected()));
    r->GetCounter("scd:node_returns_total", "Nodes back in routing after their probes passed")
        .SetTotal(static_cast<double>(e.returned()));
    const char* advice_help =
        "Other coordinators' ejections heard (heard), and this coordinator's probe of the node: "
        "passed (cleared) or failed (confirmed)";
    r->GetCounter("scd:ejection_advice_total", advice_help, {{"outcome", "heard"}})
        .SetTotal(static_cast<double>(e.advice_heard()));
    r->GetCounter("scd:ejection_advice_total", advice_help, {{"outcome", "cleared"}})
        .SetTotal(static_cast<double>(e.advice_cleared()));
    r->GetCounter("scd:ejection_advice_total", advice_help, {{"outcome", "confirmed"}})
        .SetTotal(static_cast<double>(e.advice_confirmed()));
  }
  if (stats.has_prefix_cache()) {
    const v1::PrefixCacheStats& c = stats.prefix_cache();
    r->GetGauge("scd:prefix_cache_bytes", "Bytes the prefix cache holds")
        .Set(static_cast<double>(c.bytes()));
    r->GetGauge("scd:prefix_cache_entries", "Blocks the prefix cache holds")
        .Set(static_cast<double>(c.entries()));
    r->GetCounter("scd:prefix_cache_hit_tokens_total", "Prompt positions reused from the cache")
        .SetTotal(static_cast<double>(c.hit_tokens()));
    r->GetCounter("scd:prefix_cache_lookup_tokens_total", "Prompt positions looked up")
        .SetTotal(static_cast<double>(c.lookup_tokens()));
  }
}

void AddNodeStatsCollector(MetricsRegistry* registry, std::function<void(v1::NodeStats*)> fill) {
  registry->AddCollector([registry, fill = std::move(fill)] {
    v1::NodeStats stats;
    fill(&stats);
    SetNodeGauges(registry, stats);
  });
}

}  // namespace scd
