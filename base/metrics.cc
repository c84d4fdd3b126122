#include "base/metrics.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <exception>
#include <limits>
#include <sstream>

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

namespace scd {
namespace {

// prometheus-cpp writes HELP as given; the format wants backslash and newline escaped.
std::string EscapeHelp(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

prometheus::Labels ToLabels(const MetricLabels& labels) {
  return prometheus::Labels(labels.begin(), labels.end());
}

// Strictly ascending, finite bounds (the library refuses others; +Inf is its own bucket).
std::vector<double> CleanBounds(std::vector<double> bounds) {
  bounds.erase(
      std::remove_if(bounds.begin(), bounds.end(), [](double b) { return !std::isfinite(b); }),
      bounds.end());
  std::sort(bounds.begin(), bounds.end());
  bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
  return bounds;
}

// The member of `family` (a prometheus::Family<Metric>*; null: none) with `labels`, or, where there
// is no family or the library refuses the labels, a detached metric kept in `detached`.
template <typename Metric, typename... Args>
Metric* AddOrDetach(void* family, const prometheus::Labels& labels,
                    std::deque<std::unique_ptr<Metric>>* detached, const Args&... args) {
  if (family != nullptr) {
    try {
      return &static_cast<prometheus::Family<Metric>*>(family)->Add(labels, args...);
    } catch (const std::exception&) {
    }
  }
  return detached->emplace_back(std::make_unique<Metric>(args...)).get();
}

}  // namespace

void Counter::Increment(double by) {
  if (by > 0) impl_->Increment(by);
}

void Counter::SetTotal(double total) {
  absl::MutexLock lock(&set_mu_);
  const double current = impl_->Value();
  if (total > current) impl_->Increment(total - current);
}

double Counter::Value() const { return impl_->Value(); }

void Gauge::Set(double value) { impl_->Set(value); }
void Gauge::Add(double by) { impl_->Increment(by); }
double Gauge::Value() const { return impl_->Value(); }

void Histogram::Observe(double value) {
  if (std::isnan(value)) {  // the library's bucket search would count NaN under the first bound
    std::vector<double> increments(bounds_.size() + 1, 0.0);
    increments.back() = 1;
    impl_->ObserveMultiple(increments, value);
    return;
  }
  impl_->Observe(value);
}

uint64_t Histogram::Count() const { return impl_->Collect().histogram.sample_count; }
double Histogram::Sum() const { return impl_->Collect().histogram.sample_sum; }

uint64_t Histogram::CumulativeCount(size_t i) const {
  const auto buckets = impl_->Collect().histogram.bucket;
  if (buckets.empty()) return 0;
  return buckets[std::min(i, buckets.size() - 1)].cumulative_count;
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> bounds;
  double bound = start;
  for (int i = 0; i < count; ++i, bound *= factor) bounds.push_back(bound);
  return bounds;
}

MetricsRegistry::MetricsRegistry(MetricLabels constant)
    : constant_(std::move(constant)), registry_(std::make_shared<prometheus::Registry>()) {}

MetricsRegistry::~MetricsRegistry() = default;

MetricsRegistry::Family& MetricsRegistry::FindFamily(std::string_view name, std::string_view help,
                                                     Kind kind, const std::vector<double>& bounds) {
  auto it = by_name_.find(name);
  if (it != by_name_.end()) return it->second;
  Family& family = by_name_[std::string(name)];
  family.kind = kind;
  family.bounds = CleanBounds(bounds);
  const std::string text(name), escaped = EscapeHelp(help);
  const prometheus::Labels constant = ToLabels(constant_);
  try {  // the library throws on a bad metric or label name
    switch (kind) {
      case Kind::kCounter:
        family.family =
            &prometheus::BuildCounter().Name(text).Help(escaped).Labels(constant).Register(
                *registry_);
        break;
      case Kind::kGauge:
        family.family =
            &prometheus::BuildGauge().Name(text).Help(escaped).Labels(constant).Register(
                *registry_);
        break;
      case Kind::kHistogram:
        family.family =
            &prometheus::BuildHistogram().Name(text).Help(escaped).Labels(constant).Register(
                *registry_);
        break;
    }
  } catch (const std::exception&) {
    family.family = nullptr;
  }
  return family;
}

MetricsRegistry::Member& MetricsRegistry::Find(std::string_view name, std::string_view help,
                                               Kind kind, const std::vector<double>& bounds,
                                               const MetricLabels& labels) {
  Family& family = FindFamily(name, help, kind, bounds);
  Member& member = family.members[labels];
  // A name reused with another kind, or one the library refused, gets a detached member (updated,
  // never rendered): never a crash.
  void* const registered =
      family.family != nullptr && family.kind == kind ? family.family : nullptr;
  const prometheus::Labels member_labels = ToLabels(labels);
  switch (kind) {
    case Kind::kCounter:
      if (!member.counter) {
        member.counter = std::make_unique<Counter>(
            AddOrDetach<prometheus::Counter>(registered, member_labels, &detached_counters_));
      }
      break;
    case Kind::kGauge:
      if (!member.gauge) {
        member.gauge = std::make_unique<Gauge>(
            AddOrDetach<prometheus::Gauge>(registered, member_labels, &detached_gauges_));
      }
      break;
    case Kind::kHistogram:
      if (!member.histogram) {
        const std::vector<double> own = registered ? family.bounds : CleanBounds(bounds);
        member.histogram =
            std::make_unique<Histogram>(AddOrDetach<prometheus::Histogram>(
                                            registered, member_labels, &detached_histograms_, own),
                                        own);
      }
      break;
  }
  return member;
}

Counter& MetricsRegistry::GetCounter(std::string_view name, std::string_view help,
                                     const MetricLabels& labels) {
  absl::MutexLock lock(&mu_);
  return *Find(name, help, Kind::kCounter, {}, labels).counter;
}

Gauge& MetricsRegistry::GetGauge(std::string_view name, std::string_view help,
                                 const MetricLabels& labels) {
  absl::MutexLock lock(&mu_);
  return *Find(name, help, Kind::kGauge, {}, labels).gauge;
}

Histogram& MetricsRegistry::GetHistogram(std::string_view name, std::string_view help,
                                         const std::vector<double>& bounds,
                                         const MetricLabels& labels) {
  absl::MutexLock lock(&mu_);
  return *Find(name, help, Kind::kHistogram, bounds, labels).histogram;
}

void MetricsRegistry::AddCollector(std::function<void()> collect) {
  absl::MutexLock lock(&collectors_mu_);
  collectors_.push_back(std::move(collect));
}

std::string MetricsRegistry::Render() {
  absl::MutexLock lock(&collectors_mu_);
  for (const auto& collect : collectors_) collect();
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, registry_->Collect());
  return out.str();
}

}  // namespace scd
