// Prometheus metrics: counters, gauges and histograms, grouped in families by name, each member
// told apart by its label values, rendered in Prometheus' text exposition format (0.0.4) for a
// daemon's GET /metrics. Names follow vLLM's with the `scd:` prefix
// (scd:time_to_first_token_seconds, ...); serving/serving_metrics.h declares the project's.
// The metrics and the text are prometheus-cpp's (Debian's prometheus-cpp-dev: its core registry,
// metric types and text serializer); this is the project's face on it: families looked up by name
// (first call wins), a name or label the library refuses never throws, totals copied at scrape.
//
// A family is created by the first Get* with its name; later calls with the same name return
// members of that family (the kind, help and buckets of the first call stay). A member reference
// stays valid as long as the registry: hot paths look a member up once and keep it.
// Collectors run at every Render, before the text is made, to set gauges from a node's state.
// Thread-safety: thread-safe; counter and gauge updates are lock-free, a histogram's take its
// own short lock (prometheus-cpp's).
#ifndef SCD_BASE_METRICS_H_
#define SCD_BASE_METRICS_H_

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

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
class Registry;
}  // namespace prometheus

namespace scd {

// Label name -> value, in the order rendered. Names: [a-zA-Z_][a-zA-Z0-9_]*; values: any UTF-8.
using MetricLabels = std::vector<std::pair<std::string, std::string>>;

// A monotonically increasing total (`*_total`).
class Counter {
 public:
  explicit Counter(prometheus::Counter* impl) : impl_(impl) {}
  void Increment(double by = 1);  // `by` < 0 is ignored: counters never go down
  // For a total the node already keeps (copied at scrape time): the value, never lowered.
  void SetTotal(double total);
  double Value() const;

 private:
  prometheus::Counter* const impl_;
  absl::Mutex set_mu_;  // SetTotal's read-then-add
};

class Gauge {
 public:
  explicit Gauge(prometheus::Gauge* impl) : impl_(impl) {}
  void Set(double value);
  void Add(double by);
  double Value() const;

 private:
  prometheus::Gauge* const impl_;
};

// Counts observations into cumulative buckets with upper bounds `bounds` (ascending; +Inf is
// implied; a bound is inclusive; NaN counts in +Inf), and their sum.
class Histogram {
 public:
  Histogram(prometheus::Histogram* impl, std::vector<double> bounds)
      : impl_(impl), bounds_(std::move(bounds)) {}
  void Observe(double value);
  uint64_t Count() const;
  double Sum() const;
  const std::vector<double>& bounds() const { return bounds_; }
  // Observations <= bounds()[i] (cumulative), i in [0, bounds().size()].
  uint64_t CumulativeCount(size_t i) const;

 private:
  prometheus::Histogram* const impl_;
  const std::vector<double> bounds_;
};

// Bucket bounds: `count` values from `start`, each `factor` times the one before.
std::vector<double> ExponentialBuckets(double start, double factor, int count);

class MetricsRegistry {
 public:
  // `constant` labels go on every sample this registry renders (e.g. {"role", "consumer"}).
  explicit MetricsRegistry(MetricLabels constant = {});
  ~MetricsRegistry();
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
    std::unique_ptr<Counter> counter;
    std::unique_ptr<Gauge> gauge;
    std::unique_ptr<Histogram> histogram;
  };
  struct Family {
    Kind kind;
    void* family = nullptr;  // prometheus::Family<T>* of the kind; null: the library refused it
    std::vector<double> bounds;
    std::map<MetricLabels, Member> members;
  };
  Member& Find(std::string_view name, std::string_view help, Kind kind,
               const std::vector<double>& bounds, const MetricLabels& labels)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Family& FindFamily(std::string_view name, std::string_view help, Kind kind,
                     const std::vector<double>& bounds) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const MetricLabels constant_;
  absl::Mutex collectors_mu_;  // held through a Render: collectors and scrapes one at a time
  std::vector<std::function<void()>> collectors_ ABSL_GUARDED_BY(collectors_mu_);
  mutable absl::Mutex mu_;
  std::shared_ptr<prometheus::Registry> registry_;  // thread-safe itself
  std::map<std::string, Family, std::less<>> by_name_ ABSL_GUARDED_BY(mu_);
  // Metrics the library would not register (a bad name or label): updated, never rendered.
  std::deque<std::unique_ptr<prometheus::Counter>> detached_counters_ ABSL_GUARDED_BY(mu_);
  std::deque<std::unique_ptr<prometheus::Gauge>> detached_gauges_ ABSL_GUARDED_BY(mu_);
  std::deque<std::unique_ptr<prometheus::Histogram>> detached_histograms_ ABSL_GUARDED_BY(mu_);
};

}  // namespace scd

#endif  // SCD_BASE_METRICS_H_
