#include "consumer/step_pacer.h"

#include <algorithm>
#include <limits>

namespace scd::consumer {
namespace {

constexpr double kAverageWeight = 0.25;  // the newest decode step's weight
constexpr int64_t kMeasureEvery = 64;    // steps after which decodes are measured again
constexpr double kKeep = 0.9;            // an older chunk's weight, per newer chunk
constexpr double kChunkAim = 0.85;       // the share of the time left a chunk aims at
constexpr double kTrim = 0.8;            // the aim after a step past its time, per step
constexpr double kUntrim = 1.02;         // ... and after one within it
constexpr double kMinTrim = 0.25;
constexpr int64_t kLongAlone = 32;       // prompt tokens of a prefill alone that bound the slope
constexpr double kItlDecay = 0.95;       // an earlier step's weight in an ItlCost, per Add

int64_t ToTokens(double tokens) { return static_cast<int64_t>(std::min(tokens, 1e9)); }

}  // namespace

void ItlCost::Add(double s, double t) {
  seconds = kItlDecay * seconds + std::max(0.0, s);
  tokens = kItlDecay * tokens + t;
}

StepPacer::StepPacer(double step_slack, int64_t max_decodes)
    : step_slack_(step_slack),
      decode_step_s_(static_cast<size_t>(std::max<int64_t>(1, max_decodes)) + 1, 0.0),
      decode_measured_at_(decode_step_s_.size(), -1) {}

bool StepPacer::NeedsMeasure(int64_t decodes) const {
  if (decodes <= 0) return false;
  const size_t n = std::min<size_t>(static_cast<size_t>(decodes), decode_step_s_.size() - 1);
  return decode_measured_at_[n] < 0 || steps_ - decode_measured_at_[n] > kMeasureEvery;
}

double StepPacer::DecodeStepEstimate(int64_t decodes) const {
  if (decodes <= 0) return 0;
  const int64_t last = static_cast<int64_t>(decode_step_s_.size()) - 1;
  const int64_t n = std::min<int64_t>(decodes, last);
  auto measured = [this](int64_t i) { return decode_measured_at_[static_cast<size_t>(i)] >= 0; };
  for (int64_t i = n; i >= 1; --i) {
    if (measured(i)) return decode_step_s_[static_cast<size_t>(i)];
  }
  for (int64_t i = n + 1; i <= last; ++i) {
    if (measured(i)) return decode_step_s_[static_cast<size_t>(i)];
  }
  return 0;
}

double StepPacer::Allowed(int64_t decodes) const {
  if (decodes <= 0) return std::numeric_limits<double>::infinity();
  return (step_slack_ - 1) * DecodeStepEstimate(decodes);
}

std::optional<std::pair<double, double>> StepPacer::ChunkLine() const {
  if (w_ <= 0) return std::nullopt;
  // The slope, from the sizes seen once they spread (weighted variance >= 1/2 token^2), else
  // the last slope fitted (chunks settle on one size), else none yet.
  double per_token = slope_;
  const double det = w_ * wpp_ - wp_ * wp_;
  if (det >= 0.5 * w_ * w_) per_token = (w_ * wpy_ - wp_ * wy_) / det;
  if (per_token == 0) return std::nullopt;
  // Noise over chunks of a few sizes can flatten the slope to nothing; a token beside decodes
  // costs at least half what it cost in a long prefill alone (its arithmetic does not shrink).
  per_token = std::max(per_token, 0.5 * alone_token_s_);
  // A line through noise can tilt past what costs can be (a chunk costs time, more tokens more,
  // and nothing costs less than nothing): then the cost per token seen.
  const double fixed = (wy_ - per_token * wp_) / w_;
  if (per_token < 0 || fixed < 0) return std::make_pair(0.0, std::max(0.0, wy_ / wp_));
  return std::make_pair(fixed, per_token);
}

int64_t StepPacer::ChunkTokens(double allowed) const {
  if (w_ <= 0 || !(allowed > 0)) return 0;
  const double aim = this->aim() * std::min(allowed, 1e6);
  constexpr double kFree = 1e-9;  // seconds per token below which tokens count as this
  if (const auto line = ChunkLine()) {
    const auto [fixed, per_token] = *line;
    return ToTokens((aim - std::min(fixed, aim / 2)) / std::max(per_token, kFree));
  }
  return std::max<int64_t>(ToTokens(aim / std::max(wy_ / wp_, kFree)), 2 * last_chunk_tokens_);
}

double StepPacer::aim() const { return kChunkAim * trim_; }

void StepPacer::Observe(int64_t decodes, int64_t prefill_tokens, double seconds,
                        double allowed) {
  ++steps_;
  const auto add_chunk = [this](double p, double y) {
    w_ = kKeep * w_ + 1;
    wp_ = kKeep * wp_ + p;
    wpp_ = kKeep * wpp_ + p * p;
    wy_ = kKeep * wy_ + y;
    wpy_ = kKeep * wpy_ + p * y;
  };
  if (prefill_tokens == 0) {
    if (decodes <= 0) return;
    const size_t n = std::min<size_t>(static_cast<size_t>(decodes), decode_step_s_.size() - 1);
    double& average = decode_step_s_[n];
    average = decode_measured_at_[n] < 0 ? seconds
                                         : (1 - kAverageWeight) * average + kAverageWeight * seconds;
    decode_measured_at_[n] = steps_;
  } else if (decodes > 0) {
    // What the prompt tokens added to the decodes' own time. An estimate from a slower moment
    // can make them look free: the chunk it sizes is then large, and its own cost corrects it.
    const double decodes_s = DecodeStepEstimate(decodes);
    const double added = std::max(seconds - decodes_s, 0.0);
    if (decodes_s > 0) local_itl_.Add(added, static_cast<double>(prefill_tokens));
    // Past its time: past what the step had, or (a fixed part counted only in half) past what
    // the line foresaw for this chunk, with 5 % for rounding. A chunk larger than the pacer
    // sized (the plan's floor, so that a prompt moves: the time left did not hold it) says
    // nothing of the aim, and leaves it.
    double foreseen = 0;
    if (const auto line = ChunkLine()) {
      foreseen = 1.05 * (line->first + line->second * static_cast<double>(prefill_tokens));
    }
    if (prefill_tokens <= ChunkTokens(allowed)) {
      trim_ = added > std::max(allowed, foreseen) ? std::max(kMinTrim, trim_ * kTrim)
                                                  : std::min(1.0, trim_ * kUntrim);
    }
    add_chunk(static_cast<double>(prefill_tokens), added);
    last_chunk_tokens_ = prefill_tokens;
    const double det = w_ * wpp_ - wp_ * wp_;
    if (det >= 0.5 * w_ * w_) slope_ = (w_ * wpy_ - wp_ * wy_) / det;
  } else {
    const double per_token = seconds / static_cast<double>(prefill_tokens);
    if (prefill_tokens >= kLongAlone) {
      alone_token_s_ = alone_token_s_ == 0 ? per_token : std::min(alone_token_s_, per_token);
    }
    // A first estimate from a prefill alone (cheaper per token than beside decodes: bigger
    // chunks), soon outweighed by steps beside decodes.
    if (w_ == 0) add_chunk(static_cast<double>(prefill_tokens), seconds);
  }
}

}  // namespace scd::consumer
