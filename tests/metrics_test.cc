// base/metrics.h on prometheus-cpp: the text exposition is what Prometheus parses (checked by
// Debian's promtool, an independent parser), counts are exact under concurrent updates, histogram
// buckets are cumulative with the analytic counts, HELP and label values escape what the format
// requires, and nothing the library refuses throws.
#include "base/metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/test_files.h"

namespace scd {
namespace {

using ::testing::HasSubstr;

// Debian's promtool (Prometheus' own parser) accepts `text` as an exposition.
void ExpectPromtoolAccepts(const std::string& text) {
  testing::TempDir dir;
  testing::WriteFile(dir.File("metrics.txt"), text);
  const testing::CommandResult promtool =
      testing::RunCommand("promtool check metrics < " + dir.File("metrics.txt"));
  EXPECT_EQ(promtool.exit_code, 0) << promtool.out << promtool.err << "\n" << text;
}

TEST(MetricsTest, TextExpositionPassesPromtoolAndHoldsTheValues) {
  MetricsRegistry registry(MetricLabels{{"role", "test"}});
  registry.GetCounter("test_requests_total", "Requests.\nSecond line \\ here", {{"mode", "scd"}})
      .Increment(3);
  registry.GetCounter("test_requests_total", "", {{"mode", "raw \"quoted\"\nnext\\"}})
      .Increment();
  registry.GetGauge("test_running", "Running now").Set(2.5);
  Histogram& h = registry.GetHistogram("test_latency_seconds", "Latency", {0.125, 1, 10});
  for (double v : {0.0625, 0.125, 0.5, 2.0, 20.0, 30.0}) h.Observe(v);
  const std::string text = registry.Render();

  EXPECT_THAT(text, HasSubstr("# HELP test_requests_total Requests.\\nSecond line \\\\ here\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE test_requests_total counter\n"));
  EXPECT_THAT(text, HasSubstr("test_requests_total{role=\"test\",mode=\"scd\"} 3\n"));
  EXPECT_THAT(text,
              HasSubstr("test_requests_total{role=\"test\",mode=\"raw \\\"quoted\\\"\\nnext\\\\\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("test_running{role=\"test\"} 2.5\n"));
  // Cumulative buckets: <= 0.125: 2 (bounds are inclusive), <= 1: 3, <= 10: 4, +Inf: 6.
  EXPECT_THAT(text, HasSubstr("test_latency_seconds_bucket{role=\"test\",le=\"0.125\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("test_latency_seconds_bucket{role=\"test\",le=\"1\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("test_latency_seconds_bucket{role=\"test\",le=\"10\"} 4\n"));
  EXPECT_THAT(text, HasSubstr("test_latency_seconds_bucket{role=\"test\",le=\"+Inf\"} 6\n"));
  EXPECT_THAT(text, HasSubstr("test_latency_seconds_sum{role=\"test\"} 52.6875\n"));
  EXPECT_THAT(text, HasSubstr("test_latency_seconds_count{role=\"test\"} 6\n"));

  ExpectPromtoolAccepts(text);
}

TEST(MetricsTest, ConcurrentUpdatesLoseNothing) {
  MetricsRegistry registry;
  constexpr int kThreads = 8, kEach = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&registry, t] {
      // Each thread looks the members up itself: lookups race with updates too.
      Counter& c = registry.GetCounter("c_total", "c");
      Histogram& h = registry.GetHistogram("h", "h", {1.0});
      Gauge& g = registry.GetGauge("g", "g", {{"t", t % 2 ? "odd" : "even"}});
      for (int i = 0; i < kEach; ++i) {
        c.Increment();
        h.Observe(i % 2 ? 0.5 : 2.0);
        g.Add(1);
      }
    });
  }
  std::thread renders([&registry] {
    for (int i = 0; i < 50; ++i) registry.Render();
  });
  for (auto& t : threads) t.join();
  renders.join();
  EXPECT_EQ(registry.GetCounter("c_total", "").Value(), kThreads * kEach);
  Histogram& h = registry.GetHistogram("h", "", {});
  EXPECT_EQ(h.Count(), static_cast<uint64_t>(kThreads * kEach));
  EXPECT_EQ(h.CumulativeCount(0), static_cast<uint64_t>(kThreads * kEach / 2));
  EXPECT_DOUBLE_EQ(h.Sum(), kThreads * kEach / 2 * 2.5);
  EXPECT_EQ(registry.GetGauge("g", "", {{"t", "odd"}}).Value(), kThreads / 2 * kEach);
}

TEST(MetricsTest, CollectorsRunAtRenderAndTotalsNeverGoDown) {
  MetricsRegistry registry;
  double total = 5;
  registry.AddCollector([&] { registry.GetCounter("node_total", "n").SetTotal(total); });
  EXPECT_THAT(registry.Render(), HasSubstr("node_total 5\n"));
  total = 3;  // a restarted source: the exported total stays
  EXPECT_THAT(registry.Render(), HasSubstr("node_total 5\n"));
  total = 9;
  EXPECT_THAT(registry.Render(), HasSubstr("node_total 9\n"));
}

// The library writes values at 16 significant digits: integers and short decimals exactly, the
// rest within one part in 1e15; infinities and NaN as the format spells them.
TEST(MetricsTest, ValuesAreWrittenAsPrometheusReadsThem) {
  MetricsRegistry registry;
  const std::vector<std::pair<double, std::string>> exact = {
      {0, "0"},           {123456789012345.0, "123456789012345"},
      {0.1, "0.1"},       {1e20, "1e+20"},
      {INFINITY, "+Inf"}, {-INFINITY, "-Inf"}};
  for (size_t i = 0; i < exact.size(); ++i) {
    registry.GetGauge("exact_" + std::to_string(i), "v").Set(exact[i].first);
  }
  const std::vector<double> rounded = {1.0 / 3, 2.0 / 3 * 1e-7, 123.456789012345678};
  for (size_t i = 0; i < rounded.size(); ++i) {
    registry.GetGauge("rounded_" + std::to_string(i), "v").Set(rounded[i]);
  }
  registry.GetGauge("not_a_number", "v").Set(NAN);
  const std::string text = registry.Render();
  auto value_text = [&text](const std::string& name) {
    const size_t at = text.find("\n" + name + " ");
    if (at == std::string::npos) return std::string("(missing)");
    const size_t start = at + name.size() + 2;
    return text.substr(start, text.find('\n', start) - start);
  };
  for (size_t i = 0; i < exact.size(); ++i) {
    EXPECT_EQ(value_text("exact_" + std::to_string(i)), exact[i].second) << text;
  }
  for (size_t i = 0; i < rounded.size(); ++i) {
    const double read = std::strtod(value_text("rounded_" + std::to_string(i)).c_str(), nullptr);
    EXPECT_NEAR(read, rounded[i], std::fabs(rounded[i]) * 1e-15) << text;
  }
  EXPECT_TRUE(std::isnan(std::strtod(value_text("not_a_number").c_str(), nullptr))) << text;

  ExpectPromtoolAccepts(text);
}

// A name or label the library refuses, or a name reused with another kind, never throws: the
// member still counts, only the text leaves it out.
TEST(MetricsTest, RefusedNamesAndKindsNeverThrow) {
  MetricsRegistry registry;
  Counter& bad_name = registry.GetCounter("0 bad name", "x");
  bad_name.Increment(2);
  EXPECT_EQ(bad_name.Value(), 2);
  Counter& bad_label = registry.GetCounter("ok_total", "x", {{"bad label", "v"}});
  bad_label.Increment();
  EXPECT_EQ(bad_label.Value(), 1);
  registry.GetCounter("ok_total", "x").Increment(5);
  Gauge& other_kind = registry.GetGauge("ok_total", "x");
  other_kind.Set(7);
  EXPECT_EQ(other_kind.Value(), 7);
  const std::string text = registry.Render();
  EXPECT_THAT(text, HasSubstr("ok_total 5\n"));
  EXPECT_EQ(text.find("bad"), std::string::npos) << text;
  EXPECT_EQ(text.find(" 7\n"), std::string::npos) << text;
}

}  // namespace
}  // namespace scd
