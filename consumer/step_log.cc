#include "consumer/step_log.h"

#include "absl/strings/str_format.h"

namespace scd::consumer {

StepLog::StepLog(absl::Duration interval, absl::Time start) : interval_(interval), since_(start) {}

void StepLog::Add(const StepRecord& step) {
  StepWindow& w = window_;
  ++w.steps;
  w.measuring += step.measuring ? 1 : 0;
  w.seconds += step.seconds;
  w.decodes += step.decodes;
  w.prompt_tokens += step.prompt_tokens;
  w.rebuild_rows += step.rebuild_rows;
  w.pieces += step.pieces;
  w.pieces_seconds += step.pieces_seconds;
  if (step.decodes > 0) {
    ++w.decode_steps;
    if (step.prompt_tokens > 0) {
      w.prompt_beside_tokens += step.prompt_tokens;
      ++w.prompt_beside_steps;
    }
  }
}

std::optional<std::string> StepLog::Line(absl::Time now, double aim, int64_t running) {
  if (now - since_ < interval_) return std::nullopt;
  std::optional<std::string> line;
  if (window_.steps > 0) line = StepLine(window_, now - since_, aim, running);
  window_ = StepWindow();
  since_ = now;
  return line;
}

std::string StepLine(const StepWindow& w, absl::Duration elapsed, double aim, int64_t running) {
  const double s = absl::ToDoubleSeconds(elapsed);
  auto per_s = [s](double n) { return s > 0 ? n / s : 0.0; };
  auto mean = [](double sum, int64_t n) { return n > 0 ? sum / static_cast<double>(n) : 0.0; };
  return absl::StrFormat(
      "steps over %.1f s: %d (busy %.0f %%, %.2f ms each), %.1f decode tokens/s in batches of "
      "%.1f, %.1f prompt tokens/s (%.1f a step beside decodes), %.1f rebuild rows/s (%.1f rows, "
      "%.2f ms a piece), %d measuring decodes alone, pacer aim %.2f, %d sequences",
      s, w.steps, 100 * per_s(w.seconds), 1e3 * mean(w.seconds, w.steps),
      per_s(static_cast<double>(w.decodes)), mean(static_cast<double>(w.decodes), w.decode_steps),
      per_s(static_cast<double>(w.prompt_tokens)),
      mean(static_cast<double>(w.prompt_beside_tokens), w.prompt_beside_steps),
      per_s(static_cast<double>(w.rebuild_rows)),
      mean(static_cast<double>(w.rebuild_rows), w.pieces), 1e3 * mean(w.pieces_seconds, w.pieces),
      w.measuring, aim, running);
}

}  // namespace scd::consumer
