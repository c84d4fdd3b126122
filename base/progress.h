// Progress: a progress bar with ETA on stderr for long offline work. On a terminal it redraws
// one line (at most 10 times a second); otherwise (CI logs) it prints a line every 10 %.
// Thread-safety: not thread-safe; one per task.
#ifndef SCD_BASE_PROGRESS_H_
#define SCD_BASE_PROGRESS_H_

#include <chrono>
#include <cstdint>
#include <string>

namespace scd {

class Progress {
 public:
  Progress(std::string label, int64_t total, bool enabled = true);
  ~Progress();
  void Advance(int64_t n = 1);
  void SetDetail(std::string detail);  // shown after the bar, e.g. the current loss
  void Done();

 private:
  void Draw(bool force);

  std::string label_, detail_;
  int64_t total_, done_ = 0;
  bool enabled_, tty_, finished_ = false;
  int last_decile_ = -1;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

// "1:05" style duration.
std::string FormatDuration(double seconds);

}  // namespace scd

#endif  // SCD_BASE_PROGRESS_H_
