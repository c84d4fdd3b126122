// StepLog: the decode scheduler's periodic account of its steps, as vLLM's engine logs its
// throughput every few seconds: one line per interval summing the steps since the last -- how
// many and the share of the interval they took (busy), decode tokens and prompt tokens per
// second, the mean batch of decodes, the prompt tokens a step carried beside decodes, rebuild
// rows and a rebuild piece's mean rows and time, the steps that ran decodes alone so the pacer
// could measure them, and the pacer's aim (consumer/step_pacer.h) with the sequences running. What
// an operator reads to see a consumer fall behind, and what a cluster simulator's step costs can be
// checked against. Pure: the scheduler adds each step with its time and asks for the line with the
// clock's time. Thread-safety: not thread-safe (the scheduler's thread owns it).
#ifndef SCD_CONSUMER_STEP_LOG_H_
#define SCD_CONSUMER_STEP_LOG_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/time/time.h"

namespace scd::consumer {

// One step as it ran.
struct StepRecord {
  double seconds = 0;         // its rebuild pieces and its forward
  int64_t decodes = 0;        // sequences it advanced a token
  int64_t prompt_tokens = 0;  // prompt chunks' tokens
  int64_t rebuild_rows = 0;   // rebuild pieces' rows
  bool measuring = false;     // decodes alone for the pacer (StepPlan::decodes_only)
  int64_t pieces = 0;         // rebuild pieces
  double pieces_seconds = 0;  // ... and their time (part of `seconds`)
};

// The sums of one interval's steps.
struct StepWindow {
  int64_t steps = 0, measuring = 0;
  double seconds = 0;
  int64_t decodes = 0, prompt_tokens = 0, rebuild_rows = 0;
  int64_t decode_steps = 0;          // steps with decodes
  int64_t prompt_beside_tokens = 0;  // prompt tokens of steps with decodes
  int64_t prompt_beside_steps = 0;   // steps with decodes and prompt tokens
  int64_t pieces = 0;
  double pieces_seconds = 0;
};

class StepLog {
 public:
  // `interval` > 0: a line at most once per interval; the first interval starts at `start`.
  StepLog(absl::Duration interval, absl::Time start);

  void Add(const StepRecord& step);
  // The interval's line when `interval` has passed since the last line (or the start) and a
  // step ran in it, the window then starting again at `now`; nullopt otherwise (an idle
  // consumer logs nothing). `aim`: the pacer's; `running`: sequences in the scheduler.
  std::optional<std::string> Line(absl::Time now, double aim, int64_t running);
  const StepWindow& window() const { return window_; }

 private:
  absl::Duration interval_;
  absl::Time since_;
  StepWindow window_;
};

// The line for `w` over `elapsed` (the format StepLog::Line writes).
std::string StepLine(const StepWindow& w, absl::Duration elapsed, double aim, int64_t running);

}  // namespace scd::consumer

#endif  // SCD_CONSUMER_STEP_LOG_H_
