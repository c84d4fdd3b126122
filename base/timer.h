// Wall-clock timing on the monotonic clock.
// Thread-safety: a Stopwatch is a plain value; do not share one between threads while restarting.
#ifndef SCD_BASE_TIMER_H_
#define SCD_BASE_TIMER_H_

#include <algorithm>
#include <chrono>
#include <vector>

namespace scd {

using SteadyTime = std::chrono::steady_clock::time_point;

// Seconds from `start` to now.
inline double SecondsSince(SteadyTime start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

class Stopwatch {
 public:
  Stopwatch() : start_(std::chrono::steady_clock::now()) {}
  double Seconds() const { return SecondsSince(start_); }
  // Seconds since the last Restart (or construction), then restarts.
  double Lap() {
    const double s = Seconds();
    start_ = std::chrono::steady_clock::now();
    return s;
  }
  SteadyTime start() const { return start_; }

 private:
  SteadyTime start_;
};

// The q-quantile (0..1, nearest rank from below) of timing samples; 0 when there are none.
inline double Percentile(std::vector<double> samples, double q) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  return samples[std::min(samples.size() - 1, static_cast<size_t>(q * samples.size()))];
}

// The median of the samples (the mean of the middle two when their count is even); 0 when there
// are none.
inline double Median(std::vector<double> samples) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  const size_t n = samples.size();
  return n % 2 ? samples[n / 2] : (samples[n / 2 - 1] + samples[n / 2]) / 2;
}

}  // namespace scd

#endif  // SCD_BASE_TIMER_H_
