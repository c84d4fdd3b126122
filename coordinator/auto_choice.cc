#include "coordinator/auto_choice.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "proto/node_speeds.h"
#include "proto/wire_mode.h"

namespace scd::coordinator {

namespace {

constexpr double kHeldBackRatio = 1.25;  // transfer / prefill above this: the link held it back
constexpr double kFasterRatio = 0.8;     // transfer / estimate under this: the link got faster
// How much faster than the rule's choice another must be predicted for auto to take it.
constexpr double kMinGainUs = 1000;
constexpr double kMinGainRatio = 0.05;

std::string Ms(double us) { return absl::StrFormat("%.1f ms", us / 1e3); }

std::string Prediction(const AutoCandidate& c) {
  std::string out =
      absl::StrCat(Ms(c.predicted.total_us), " (", TtftStageName(c.predicted.bound_by), "-bound)");
  if (c.batch_us > 0) absl::StrAppend(&out, " + ", Ms(c.batch_us), " of the batch's ITL");
  return out;
}

}  // namespace

void LinkEstimate::Observe(const v1::Finished& finished, absl::Time now) {
  const v1::Timings& t = finished.timings();
  if (RanMode(finished) == TransferMode::kLocal || finished.payload_bytes() == 0 ||
      t.transfer() == 0)
    return;
  const double bytes = static_cast<double>(finished.payload_bytes());
  const double took = static_cast<double>(t.transfer());
  if (took > kHeldBackRatio * static_cast<double>(t.prefill())) {
    if (now - last_ > max_age_) samples_ = CostEstimate(16);  // stale samples: start afresh
    samples_.Add(bytes, took);
    last_ = now;
  } else if (Known(now) && took < kFasterRatio * samples_.At(bytes)) {
    samples_ = CostEstimate(16);  // it finished faster than the estimate allows
    last_ = absl::InfinitePast();
  }
}

bool LinkEstimate::Known(absl::Time now) const {
  return samples_.known() && now - last_ <= max_age_ && samples_.per_unit() > 0;
}

double LinkEstimate::goodput_bytes_per_s() const {
  return samples_.per_unit() > 0 ? 1e6 / samples_.per_unit() : 0;
}

const v1::LinearCost& PrefillOf(const v1::NodeSpeeds& own, const v1::NodeSpeeds& other) {
  return own.prefill().samples() > 0 ? own.prefill() : other.prefill();
}

bool CanPredict(const AutoInputs& in) {
  return in.consumer.prefill().samples() > 0 || in.producer.prefill().samples() > 0;
}

TtftPrediction PredictLocal(const AutoInputs& in) {
  const double n = std::max(1.0, in.prompt_tokens - in.consumer_cached_tokens);
  TtftInputs local;
  local.prefill_us = CostAt(PrefillOf(in.consumer, in.producer), n);
  // Beside decoding sequences a local prefill advances only in their steps' slack.
  if (in.consumer_decoding > 0 && in.consumer.busy_prefill().samples() > 0) {
    local.prefill_us = std::max(local.prefill_us, n * in.consumer.busy_prefill().per_unit_us());
  }
  local.queue_us = in.consumer_queue * local.prefill_us;
  return PredictTtft(local);
}

double BatchDelayUs(const AutoInputs& in, const v1::LinearCost& itl, double tokens) {
  if (in.consumer_decoding <= 0 || itl.samples() == 0) return 0;
  return in.consumer_decoding * std::max(0.0, tokens) * itl.per_unit_us();
}

TtftPrediction PredictTransfer(const AutoInputs& in, double bytes_per_token,
                               double rebuild_us_per_token, bool rebuilds) {
  const double computed = std::max(1.0, in.prompt_tokens - in.producer_cached_tokens);
  // The prompt's prefix (every token but the last) past what the consumer's cache holds.
  const double sent = std::max(0.0, in.prompt_tokens - 1 - in.consumer_cached_tokens);
  TtftInputs t;
  t.transfer = true;
  t.prefill_us = CostAt(PrefillOf(in.producer, in.consumer), computed);
  t.queue_us = in.producer_queue * t.prefill_us;
  t.payload_bytes = bytes_per_token * sent;
  t.goodput_bytes_per_s = in.goodput_bytes_per_s;
  t.latency_us = in.latency_us;
  if (rebuilds) {
    t.rebuild_us = in.consumer.rebuild().samples() > 0 ? CostAt(in.consumer.rebuild(), sent)
                                                        : rebuild_us_per_token * sent;
  }
  t.last_rebuild_us = t.rebuild_us / std::max(1, in.layers);
  t.decode_us = CostAt(in.consumer.first_decode(), in.prompt_tokens);
  return PredictTtft(t);
}

std::string PointText(const Frontier& frontier, const FrontierPoint& p) {
  return absl::StrFormat("#%d %s (KL %.4g, %.1f B/token)", &p - frontier.points.data(),
                         p.Describe(), p.kl, p.bytes_per_token);
}

std::vector<AutoCandidate> AutoCandidates(const AutoInputs& in, const Frontier* frontier,
                                          double raw_bytes_per_token) {
  std::vector<AutoCandidate> out;
  AutoCandidate& local = out.emplace_back();
  local.mode = TransferMode::kLocal;
  local.label = "local prefill";
  local.predicted = PredictLocal(in);
  local.batch_us = BatchDelayUs(in, in.consumer.local_itl(),
                                std::max(1.0, in.prompt_tokens - in.consumer_cached_tokens));
  if (frontier == nullptr) {
    AutoCandidate& raw = out.emplace_back();
    raw.mode = TransferMode::kRaw;
    raw.label = "the raw cache";
    raw.predicted = PredictTransfer(in, raw_bytes_per_token, 0, false);
    return out;
  }
  for (const FrontierPoint& p : frontier->points) {
    AutoInputs at = in;
    at.layers = std::max<int>(1, static_cast<int>(p.rank_k.size()));
    AutoCandidate& c = out.emplace_back();
    c.mode = TransferMode::kScd;
    c.point = p;
    c.kl = p.kl;
    c.label = absl::StrCat("scd point ", PointText(*frontier, p));
    c.predicted = PredictTransfer(at, p.bytes_per_token, p.rebuild_us_per_token, true);
    c.batch_us = BatchDelayUs(in, in.consumer.rebuild_itl(),
                              std::max(0.0, in.prompt_tokens - 1 - in.consumer_cached_tokens));
  }
  return out;
}

AutoChoice ChooseAuto(const std::vector<AutoCandidate>& candidates, double max_kl,
                      const std::string& budget, double slo_us, std::optional<size_t> incumbent) {
  std::vector<size_t> order;
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (max_kl <= 0 || candidates[i].kl <= max_kl) order.push_back(i);
  }
  if (order.empty()) order.push_back(0);  // nothing within the budget: callers put local first
  auto faster = [&](size_t a, size_t b) {
    const double ta = candidates[a].cost_us(), tb = candidates[b].cost_us();
    return ta != tb ? ta < tb : candidates[a].kl < candidates[b].kl;
  };
  std::stable_sort(order.begin(), order.end(), faster);
  AutoChoice choice;
  std::string why = absl::StrCat("the fastest predicted within ", budget);
  if (candidates[order[0]].batch_us > 0 ||
      (order.size() > 1 && candidates[order[1]].batch_us > 0)) {
    why = absl::StrCat(
        "the least delay predicted (its TTFT and the decoding sequences' ITL) within ", budget);
  }
  if (slo_us > 0) {
    auto meets = [&](size_t i) { return candidates[i].predicted.total_us <= slo_us; };
    const std::string slo = absl::StrCat("ttft_slo_ms ", absl::StrFormat("%g", slo_us / 1e3));
    if (std::any_of(order.begin(), order.end(), meets)) {
      // Those meeting it by quality, then the rest by speed.
      std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        if (meets(a) != meets(b)) return meets(a);
        if (!meets(a)) return faster(a, b);
        return candidates[a].kl != candidates[b].kl ? candidates[a].kl < candidates[b].kl
                                                    : faster(a, b);
      });
      why = absl::StrCat("the best quality predicted to meet ", slo, " within ", budget);
    } else {
      why = absl::StrCat("none is predicted to meet ", slo, ": the fastest within ", budget);
    }
  }
  // Without an objective, the rule's choice stands unless another is clearly faster: a
  // prediction is not exact, and a choice that flips on noise helps nobody.
  if (slo_us <= 0 && incumbent.has_value() && *incumbent < candidates.size() &&
      order[0] != *incumbent &&
      std::find(order.begin(), order.end(), *incumbent) != order.end()) {
    const double kept = candidates[*incumbent].cost_us();
    const double best = candidates[order[0]].cost_us();
    if (kept - best < std::max(kMinGainUs, kMinGainRatio * kept)) {
      order.erase(std::find(order.begin(), order.end(), *incumbent));
      order.insert(order.begin(), *incumbent);
      why = absl::StrFormat("kept: nothing within %s is predicted faster by %.0f ms and %.0f %%",
                            budget, kMinGainUs / 1e3, kMinGainRatio * 100);
    }
  }
  choice.chosen = order[0];
  if (order.size() > 1) choice.runner_up = order[1];
  const AutoCandidate& c = candidates[choice.chosen];
  choice.reason = absl::StrCat("auto: ", c.label, " predicted ", Prediction(c), ", ", why);
  if (choice.runner_up) {
    const AutoCandidate& r = candidates[*choice.runner_up];
    absl::StrAppend(&choice.reason, "; runner-up ", r.label, " predicted ", Prediction(r));
  }
  return choice;
}

double DeliverByUs(const TtftPrediction& predicted, double slo_us) {
  if (slo_us > 0) {
    const double after_last_byte = std::max(0.0, predicted.total_us - predicted.delivered_us);
    return std::max(1.0, slo_us - after_last_byte);
  }
  return predicted.delivered_us * 1.25 + 2000.0;
}

}  // namespace scd::coordinator
