// Prometheus-style metrics: counters, gauges and histograms, grouped in families by name, each
// member told apart by its label values, rendered in Prometheus' text exposition format (0.0.4)
// for a daemon's GET /metrics. Names follow vLLM's with the `scd:` prefix
// (scd:time_to_first_token_seconds, ...); proto/serving_metrics.h declares the project's.
//
// A family is created by the first Get* with its name; later calls with the same name return
// members of that family (the kind, help and buckets of the first call stay). A member reference
// stays valid as long as the registry: hot paths look a member up once and keep it.
// Collectors run at every Render, before the text is made, to set gauges from a node's state.
// Thread-safety: thread-safe; updates of a member are lock-free.
#ifndef SCD_BASE_METRICS_H_
#define SCD_BASE_METRICS_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace scd {

// Label name -> value, in the order rendered. Names: [a-zA-Z_][a-zA-Z0-9_]*; values: any UTF-8.
using MetricLabels = std::vector<std::pair<std::string, std::string>>;

// A monotonically increasing total (`*_total`).
class Counter {
 public:
  void Increment(double by = 1);  // `by` < 0 is ignored: counters never go down
  // For a total the node already keeps (copied at scrape time): the value, never lowered.
  void SetTotal(double total);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Gauge {
 public:
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Add(double by);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// Counts observations into cumulative buckets with upper bounds `bounds` (ascending; +Inf is
// implied), and their sum.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);
  uint64_t Count() const { return count_.load(std::memory_order_relaxed); }
  double Sum() const { return sum_.load(std::memory_order_relaxed); }
  const std::vector<double>& bounds() const { return bounds_; }
  // Observations <= bounds()[i] (cumulative), i in [0, bounds().size()].
  uint64_t CumulativeCount(size_t i) const;

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // per bucket, not cumulative; last: +Inf
  std::atomic<uint64_t> count_{0};
  std::atomic<double> sum_{0};
};

// Bucket bounds: `count` values from `start`, each `factor` times the one before.
std::vector<double> ExponentialBuckets(double start, double factor, int count);

class MetricsRegistry {
 public:
  // `constant` labels go on every sample this registry renders (e.g. {"role", "consumer"}).
  explicit MetricsRegistry(MetricLabels constant = {});
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  Counter& GetCounter(std::string_view name, std::string_view help,
                      const MetricLabels& labels = {});
  Gauge& GetGauge(std::string_view name, std::string_view help, const MetricLabels& labels = {});
  Histogram& GetHistogram(std::string_view name, std::string_view help,
                          const std::vector<double>& bounds, const MetricLabels& labels = {});

  // Runs before every Render (outside the registry's lock: it may call Get*/Set).
  void AddCollector(std::function<void()> collect);

  // The text exposition of every family, in the order they were created.
  std::string Render();

 private:
  enum class Kind { kCounter, kGauge, kHistogram };
  struct Member {
    MetricLabels labels;
    std::unique_ptr<Counter> counter;
    std::unique_ptr<Gauge> gauge;
    std::unique_ptr<Histogram> histogram;
  };
  struct Family {
    std::string name, help;
    Kind kind;
    std::vector<double> bounds;
    std::deque<Member> members;
  };
  Member& Find(std::string_view name, std::string_view help, Kind kind,
               const std::vector<double>& bounds, const MetricLabels& labels)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RenderFamily(const Family& family, std::string* out) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const MetricLabels constant_;
  absl::Mutex collectors_mu_;
  std::vector<std::function<void()>> collectors_ ABSL_GUARDED_BY(collectors_mu_);
  mutable absl::Mutex mu_;
  std::deque<Family> families_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Family*, std::less<>> by_name_ ABSL_GUARDED_BY(mu_);
};

// Prometheus' float text: integers exactly, "+Inf", "-Inf", "NaN", else shortest round-trip.
std::string FormatMetricValue(double value);

}  // namespace scd

#endif  // SCD_BASE_METRICS_H_
