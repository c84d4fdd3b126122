#include "bench/profile_fit.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/timer.h"

namespace scd::bench {
namespace {

// Rows and costs of one cost model, gathered from the samples that show it.
struct Series {
  std::vector<std::vector<double>> rows;
  std::vector<double> y;
};

// The prefill's terms for n computed tokens after c cached ones: 1, n, n * c + n (n + 1) / 2.
std::vector<double> PrefillRow(double n, double c) { return {1, n, n * c + n * (n + 1) / 2}; }

// Fits `series` for `cost`, adding the report; INVALID_ARGUMENT naming the cost when its samples
// are fewer than twice its terms (a fit through as many points as terms says nothing of noise).
absl::StatusOr<CostFit> Fit(const std::string& cost, const Series& series,
                            std::vector<FitReport>* fits) {
  const size_t terms = series.rows.empty() ? 0 : series.rows[0].size();
  if (series.y.size() < 2 * std::max<size_t>(terms, 1)) {
    return absl::InvalidArgumentError(absl::StrCat(cost, ": ", series.y.size(),
                                                   " samples, a fit of ", terms,
                                                   " terms needs at least ", 2 * terms));
  }
  absl::StatusOr<CostFit> fit = FitNonNegative(series.rows, series.y);
  if (!fit.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(cost, ": ", fit.status().message()));
  }
  fits->push_back({cost, static_cast<int>(series.y.size()), *fit});
  return fit;
}

// The producer's link from the lag of each transfer's last layer: latency + bytes / goodput. A
// fit that finds no per-byte term (the link far faster than the lag's noise) takes the fastest
// goodput the samples show, so the profile never claims more than was seen.
absl::Status FitLink(const std::vector<PromptSample>& remote, NodeProfile* producer,
                     std::vector<FitReport>* fits) {
  Series link;
  double seen_gbps = 0;
  for (const PromptSample& s : remote) {
    if (s.layers <= 0 || s.payload_bytes <= 0) continue;
    const double lag = std::max(0.0, s.first_layer_out_us + s.transfer_us - s.last_layer_out_us);
    const double bytes = static_cast<double>(s.payload_bytes) / s.layers;
    link.rows.push_back({1, bytes});
    link.y.push_back(std::max(lag, 1.0));
    seen_gbps = std::max(seen_gbps, bytes * 8 / (std::max(lag, 1.0) * 1e3));
  }
  SCD_ASSIGN_OR_RETURN(CostFit fit, Fit("producer.link", link, fits));
  producer->link_latency_us = fit.coefficients[0];
  producer->link_goodput_gbps =
      fit.coefficients[1] > 0 ? 8.0 / (fit.coefficients[1] * 1e3) : seen_gbps;
  return absl::OkStatus();
}

absl::Status FitProducer(const ProfileFitInput& in, NodeProfile* p, std::vector<FitReport>* fits) {
  p->role = NodeRole::kProducer;
  p->model = in.producer_model;
  p->machine = in.machine;
  p->cpu_quota = in.producer_cpus;
  Series prefill, encode;
  std::vector<PromptSample> remote;
  for (const PromptSample& s : in.prompts) {
    if (s.local) continue;
    remote.push_back(s);
    const double n = static_cast<double>(s.prompt_tokens - 1 - s.producer_cached);
    if (n <= 0) continue;  // every position cached: the pass computed nothing
    prefill.rows.push_back(PrefillRow(n, static_cast<double>(s.producer_cached)));
    prefill.y.push_back(s.prefill_us);
    encode.rows.push_back({1, n});
    encode.y.push_back(s.encode_us);
  }
  SCD_ASSIGN_OR_RETURN(CostFit f, Fit("producer.prefill", prefill, fits));
  p->prefill = {f.coefficients[0], f.coefficients[1], f.coefficients[2]};
  SCD_ASSIGN_OR_RETURN(f, Fit("producer.encode", encode, fits));
  p->encode = {f.coefficients[0], f.coefficients[1]};
  return FitLink(remote, p, fits);
}

// The median of what each measured request's client saw beyond the consumer's own TTFT (never
// below 0: clocks of one machine, but a rounding of the server's microseconds).
double ApiOverheadUs(const std::vector<PromptSample>& prompts, bool idle) {
  std::vector<double> beyond;
  for (const PromptSample& s : prompts) {
    if ((s.idle_us > 0) == idle && s.client_ttft_us > 0 && s.server_ttft_us > 0) {
      beyond.push_back(std::max(0.0, s.client_ttft_us - s.server_ttft_us));
    }
  }
  return Median(std::move(beyond));
}

absl::Status FitConsumer(const ProfileFitInput& in, NodeProfile* p, std::vector<FitReport>* fits) {
  p->role = NodeRole::kConsumer;
  p->model = in.consumer_model;
  p->machine = in.machine;
  p->cpu_quota = in.consumer_cpus;
  Series prefill, rebuild, first_decode, step;
  for (const PromptSample& s : in.prompts) {
    if (s.local) {
      const double n = static_cast<double>(s.prompt_tokens - s.consumer_cached);
      prefill.rows.push_back(PrefillRow(n, static_cast<double>(s.consumer_cached)));
      prefill.y.push_back(s.prefill_us);
      continue;
    }
    const double received = static_cast<double>(s.prompt_tokens - 1 - s.consumer_cached);
    if (received > 0) {
      rebuild.rows.push_back({1, received});
      rebuild.y.push_back(s.rebuild_us);
    }
    first_decode.rows.push_back({1, static_cast<double>(s.prompt_tokens)});
    first_decode.y.push_back(s.first_decode_us);
  }
  for (const StepSample& s : in.steps) {
    step.rows.push_back(
        {1, static_cast<double>(s.sequences), static_cast<double>(s.context_tokens)});
    step.y.push_back(s.step_us);
  }
  SCD_ASSIGN_OR_RETURN(CostFit f, Fit("consumer.prefill", prefill, fits));
  p->prefill = {f.coefficients[0], f.coefficients[1], f.coefficients[2]};
  SCD_ASSIGN_OR_RETURN(f, Fit("consumer.rebuild", rebuild, fits));
  p->rebuild = {f.coefficients[0], f.coefficients[1]};
  SCD_ASSIGN_OR_RETURN(f, Fit("consumer.first_decode", first_decode, fits));
  p->first_decode = {f.coefficients[0], f.coefficients[1]};
  SCD_ASSIGN_OR_RETURN(f, Fit("consumer.decode_step", step, fits));
  p->decode_step = {f.coefficients[0], f.coefficients[1], f.coefficients[2]};
  p->local_itl_us = in.local_itl_us;
  p->rebuild_itl_us = in.rebuild_itl_us;
  p->busy_prefill_us = in.busy_prefill_us;
  p->kv_bytes_per_token = in.kv_bytes_per_token;
  p->kv_budget_bytes = in.kv_budget_bytes;
  p->capacity = in.capacity;
  p->step_rows = in.step_rows;
  return absl::OkStatus();
}

// The gaps every stream has (the shortest stream's count; 0 with no stream): StepFromGaps' and
// StepRatios' later half is of these.
size_t ShortestGaps(const std::vector<std::vector<double>>& gaps) {
  if (gaps.empty()) return 0;
  size_t shortest = gaps[0].size();
  for (const std::vector<double>& g : gaps) shortest = std::min(shortest, g.size());
  return shortest;
}

// FitIdle against `busy`, the busy samples' medians by shape (MedianByShape of the same input).
IdleCost FitIdleAgainst(const ProfileFitInput& in, const ProfileFitInput& busy_medians, bool local);

}  // namespace

StepSample StepFromGaps(const std::vector<std::vector<double>>& gaps, int64_t prompt_tokens) {
  const size_t shortest = ShortestGaps(gaps);
  if (shortest < 2) return {};
  const size_t from = shortest / 2;
  double sum = 0;
  for (const std::vector<double>& g : gaps) {
    for (size_t j = from; j < shortest; ++j) sum += g[j];
  }
  const int64_t streams = static_cast<int64_t>(gaps.size());
  const double middle = static_cast<double>(from + shortest - 1) / 2;  // of the gap indices
  StepSample step;
  step.sequences = streams;
  step.context_tokens = streams * (prompt_tokens + static_cast<int64_t>(std::llround(middle)) + 1);
  step.step_us = sum / static_cast<double>(streams * static_cast<int64_t>(shortest - from)) * 1e6;
  return step;
}

IdleCost FitIdle(const ProfileFitInput& in, bool local) {
  return FitIdleAgainst(in, MedianByShape(in), local);
}

namespace {

IdleCost FitIdleAgainst(const ProfileFitInput& in, const ProfileFitInput& busy_medians,
                        bool local) {
  using PromptShape = std::tuple<bool, int64_t, int64_t, int64_t>;
  std::map<PromptShape, double> busy;
  for (const PromptSample& s : busy_medians.prompts) {
    busy[{s.local, s.prompt_tokens, s.producer_cached, s.consumer_cached}] = s.prefill_us;
  }
  std::vector<double> ratios, idles;
  for (const PromptSample& s : in.prompts) {
    if (s.idle_us <= 0 || s.local != local) continue;
    const auto of = busy.find({s.local, s.prompt_tokens, s.producer_cached, s.consumer_cached});
    if (of == busy.end() || of->second <= 0) continue;
    ratios.push_back(s.prefill_us / of->second);
    idles.push_back(s.idle_us);
  }
  IdleCost idle;
  if (ratios.empty()) return idle;
  idle.after_us = Median(idles);
  idle.slowdown_p50 = std::max(1.0, Median(ratios));
  idle.slowdown_p90 = std::max(idle.slowdown_p50, Percentile(ratios, 0.9));
  if (local) idle.api_overhead_us = ApiOverheadUs(in.prompts, true);
  return idle;
}

}  // namespace

std::vector<double> StepRatios(const std::vector<std::vector<double>>& gaps) {
  const size_t shortest = ShortestGaps(gaps);
  if (shortest < 2) return {};
  std::vector<double> steps;
  for (const std::vector<double>& g : gaps) {
    std::vector<double> half(g.begin() + static_cast<std::ptrdiff_t>(shortest / 2),
                             g.begin() + static_cast<std::ptrdiff_t>(shortest));
    const double median = Median(half);
    for (size_t j = 1; j < half.size(); ++j) {
      if (half[j] < median / 2) half[j] = half[j - 1] = (half[j] + half[j - 1]) / 2;
    }
    steps.insert(steps.end(), half.begin(), half.end());
  }
  double sum = 0;
  for (double x : steps) sum += x;
  const double mean = sum / static_cast<double>(steps.size());
  if (mean <= 0) return {};
  for (double& x : steps) x /= mean;
  return steps;
}

ProfileFitInput MedianByShape(const ProfileFitInput& in) {
  using PromptShape = std::tuple<bool, int64_t, int64_t, int64_t>;
  std::map<PromptShape, std::vector<const PromptSample*>> prompts;
  std::vector<PromptShape> prompt_order;
  for (const PromptSample& s : in.prompts) {
    if (s.idle_us > 0) continue;  // FitIdle's
    const PromptShape shape{s.local, s.prompt_tokens, s.producer_cached, s.consumer_cached};
    if (prompts[shape].empty()) prompt_order.push_back(shape);
    prompts[shape].push_back(&s);
  }
  ProfileFitInput out = in;
  out.prompts.clear();
  for (const PromptShape& shape : prompt_order) {
    const std::vector<const PromptSample*>& of = prompts[shape];
    PromptSample m = *of.front();
    for (double PromptSample::*cost :
         {&PromptSample::prefill_us, &PromptSample::encode_us, &PromptSample::rebuild_us,
          &PromptSample::first_decode_us, &PromptSample::transfer_us,
          &PromptSample::first_layer_out_us, &PromptSample::last_layer_out_us,
          &PromptSample::client_ttft_us, &PromptSample::server_ttft_us}) {
      std::vector<double> v;
      for (const PromptSample* s : of) v.push_back(s->*cost);
      m.*cost = Median(std::move(v));
    }
    std::vector<double> bytes;
    for (const PromptSample* s : of) bytes.push_back(static_cast<double>(s->payload_bytes));
    m.payload_bytes = std::llround(Median(std::move(bytes)));
    out.prompts.push_back(m);
  }
  std::map<std::pair<int64_t, int64_t>, std::vector<double>> steps;
  out.steps.clear();
  for (const StepSample& s : in.steps) {
    std::vector<double>& of = steps[{s.sequences, s.context_tokens}];
    if (of.empty()) out.steps.push_back(s);
    of.push_back(s.step_us);
  }
  for (StepSample& s : out.steps) s.step_us = Median(steps[{s.sequences, s.context_tokens}]);
  return out;
}

absl::StatusOr<ProfileFitResult> FitProfiles(const ProfileFitInput& raw) {
  ProfileFitResult r;
  ProfileFitInput input = MedianByShape(raw);
  SCD_RETURN_IF_ERROR(FitProducer(input, &r.producer, &r.fits));
  SCD_RETURN_IF_ERROR(FitConsumer(input, &r.consumer, &r.fits));
  r.consumer.api_overhead_us = ApiOverheadUs(raw.prompts, false);
  r.producer.idle = FitIdleAgainst(raw, input, false);
  if (raw.step_ratios.size() >= 20) {
    const std::vector<double>& q = raw.step_ratios;
    r.consumer.step_noise = {Percentile(q, 0.1), Percentile(q, 0.5), Percentile(q, 0.9),
                             Percentile(q, 0.99)};
  }
  r.consumer.idle = FitIdleAgainst(raw, input, true);
  SCD_RETURN_IF_ERROR(CheckNodeProfile(r.producer));
  SCD_RETURN_IF_ERROR(CheckNodeProfile(r.consumer));
  return r;
}

}  // namespace scd::bench
