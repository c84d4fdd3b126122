#include "base/metrics.h"

#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"

namespace scd {
namespace {

void AtomicAdd(std::atomic<double>& value, double by) {
  double current = value.load(std::memory_order_relaxed);
  while (!value.compare_exchange_weak(current, current + by, std::memory_order_relaxed)) {
  }
}

// HELP text: backslash and newline escaped.
std::string EscapeHelp(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

// Label values: backslash, double quote and newline escaped.
std::string EscapeLabelValue(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string LabelText(const MetricLabels& constant, const MetricLabels& labels,
                      const std::pair<std::string, std::string>* extra = nullptr) {
  std::string out;
  auto add = [&out](const std::pair<std::string, std::string>& label) {
    absl::StrAppend(&out, out.empty() ? "{" : ",", label.first, "=\"",
                    EscapeLabelValue(label.second), "\"");
  };
  for (const auto& label : constant) add(label);
  for (const auto& label : labels) add(label);
  if (extra != nullptr) add(*extra);
  if (!out.empty()) out += "}";
  return out;
}

}  // namespace

void Counter::Increment(double by) {
  if (by > 0) AtomicAdd(value_, by);
}

void Counter::SetTotal(double total) {
  double current = value_.load(std::memory_order_relaxed);
  while (total > current &&
         !value_.compare_exchange_weak(current, total, std::memory_order_relaxed)) {
  }
}

void Gauge::Add(double by) { AtomicAdd(value_, by); }

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), buckets_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0);
}

void Histogram::Observe(double value) {
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;  // NaN lands in +Inf
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  AtomicAdd(sum_, value);
  count_.fetch_add(1, std::memory_order_relaxed);
}

uint64_t Histogram::CumulativeCount(size_t i) const {
  uint64_t total = 0;
  for (size_t b = 0; b <= i && b <= bounds_.size(); ++b) {
    total += buckets_[b].load(std::memory_order_relaxed);
  }
  return total;
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> bounds;
  double bound = start;
  for (int i = 0; i < count; ++i, bound *= factor) bounds.push_back(bound);
  return bounds;
}

std::string FormatMetricValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  if (value == std::floor(value) && std::fabs(value) < 9007199254740992.0) {
    return absl::StrCat(static_cast<int64_t>(value));
  }
  char text[32];
  for (int precision = 6; precision <= 17; ++precision) {
    std::snprintf(text, sizeof text, "%.*g", precision, value);
    if (std::strtod(text, nullptr) == value) break;
  }
  return text;
}

MetricsRegistry::MetricsRegistry(MetricLabels constant) : constant_(std::move(constant)) {}

MetricsRegistry::Member& MetricsRegistry::Find(std::string_view name, std::string_view help,
                                               Kind kind, const std::vector<double>& bounds,
                                               const MetricLabels& labels) {
  auto it = by_name_.find(name);
  Family* family;
  if (it == by_name_.end()) {
    family = &families_.emplace_back();
    family->name = std::string(name);
    family->help = std::string(help);
    family->kind = kind;
    family->bounds = bounds;
    by_name_.emplace(family->name, family);
  } else {
    family = it->second;
  }
  for (Member& member : family->members) {
    if (member.labels == labels) return member;
  }
  Member& member = family->members.emplace_back();
  member.labels = labels;
  // A name reused with another kind gets a member of the family's own kind (never a crash).
  switch (family->kind) {
    case Kind::kCounter: member.counter = std::make_unique<Counter>(); break;
    case Kind::kGauge: member.gauge = std::make_unique<Gauge>(); break;
    case Kind::kHistogram: member.histogram = std::make_unique<Histogram>(family->bounds); break;
  }
  if (kind == Kind::kCounter && !member.counter) member.counter = std::make_unique<Counter>();
  if (kind == Kind::kGauge && !member.gauge) member.gauge = std::make_unique<Gauge>();
  if (kind == Kind::kHistogram && !member.histogram) {
    member.histogram = std::make_unique<Histogram>(bounds);
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

void MetricsRegistry::RenderFamily(const Family& family, std::string* out) const {
  static constexpr const char* kTypes[] = {"counter", "gauge", "histogram"};
  absl::StrAppend(out, "# HELP ", family.name, " ", EscapeHelp(family.help), "\n# TYPE ",
                  family.name, " ", kTypes[static_cast<int>(family.kind)], "\n");
  for (const Member& member : family.members) {
    if (member.counter) {
      absl::StrAppend(out, family.name, LabelText(constant_, member.labels), " ",
                      FormatMetricValue(member.counter->Value()), "\n");
    } else if (member.gauge) {
      absl::StrAppend(out, family.name, LabelText(constant_, member.labels), " ",
                      FormatMetricValue(member.gauge->Value()), "\n");
    } else if (member.histogram) {
      const Histogram& h = *member.histogram;
      // Count first: a concurrent Observe may land between the lines, and the buckets must
      // never exceed _count (+Inf is rendered as the count).
      const uint64_t count = h.Count();
      const double sum = h.Sum();
      for (size_t i = 0; i < h.bounds().size(); ++i) {
        const std::pair<std::string, std::string> le{"le", FormatMetricValue(h.bounds()[i])};
        absl::StrAppend(out, family.name, "_bucket", LabelText(constant_, member.labels, &le),
                        " ", std::min(count, h.CumulativeCount(i)), "\n");
      }
      const std::pair<std::string, std::string> inf{"le", "+Inf"};
      absl::StrAppend(out, family.name, "_bucket", LabelText(constant_, member.labels, &inf), " ",
                      count, "\n", family.name, "_sum", LabelText(constant_, member.labels), " ",
                      FormatMetricValue(sum), "\n", family.name, "_count",
                      LabelText(constant_, member.labels), " ", count, "\n");
    }
  }
}

std::string MetricsRegistry::Render() {
  std::vector<std::function<void()>> collectors;
  {
    absl::MutexLock lock(&collectors_mu_);
    collectors = collectors_;
  }
  for (const auto& collect : collectors) collect();
  std::string out;
  absl::ReaderMutexLock lock(&mu_);
  for (const Family& family : families_) RenderFamily(family, &out);
  return out;
}

}  // namespace scd
