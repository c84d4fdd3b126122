// Wall-clock timing on the monotonic clock.
// Thread-safety: a Stopwatch is a plain value; do not share one between threads while restarting.
#ifndef SCD_BASE_TIMER_H_
#define SCD_BASE_TIMER_H_

#include <chrono>

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

}  // namespace scd

#endif  // SCD_BASE_TIMER_H_
