#include "bench/link_trace.h"

#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace scd::bench {

absl::StatusOr<std::vector<TraceStep>> ParseBandwidthTrace(const std::string& text) {
  std::vector<TraceStep> trace;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    const std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t,"), absl::SkipEmpty());
    TraceStep step;
    const bool rate_ok =
        fields.size() == 2 && (fields[1] == "inf" ? (step.gbps = INFINITY, true)
                                                  : absl::SimpleAtod(fields[1], &step.gbps));
    if (!rate_ok || !absl::SimpleAtod(fields[0], &step.at_s) || !std::isfinite(step.at_s) ||
        !(step.gbps > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("a bandwidth trace, line ", line_number, ": '", line,
                       "' is not \"SECONDS GBPS\" (a time and a rate > 0 in Gbit/s, or inf)"));
    }
    if (trace.empty() ? step.at_s != 0 : step.at_s <= trace.back().at_s) {
      return absl::InvalidArgumentError(absl::StrCat("a bandwidth trace, line ", line_number,
                                                     ": times must start at 0 and ascend (got ",
                                                     step.at_s, ")"));
    }
    trace.push_back(step);
  }
  if (trace.empty()) return absl::InvalidArgumentError("a bandwidth trace with no step");
  return trace;
}

double RateAt(const std::vector<TraceStep>& trace, double t) {
  double rate = trace.empty() ? INFINITY : trace.front().gbps;
  for (const TraceStep& step : trace) {
    if (step.at_s <= t) rate = step.gbps;
  }
  return rate;
}

double TraceSendSeconds(const std::vector<TraceStep>& trace, double start_s, double bytes) {
  if (!(bytes > 0)) return 0;
  double t = start_s, left = bytes;
  for (size_t i = 0;; ++i) {
    // The step in force at t, and when the next one begins.
    if (i + 1 < trace.size() && trace[i + 1].at_s <= t) continue;
    const double gbps = i < trace.size() ? trace[i].gbps : INFINITY;
    if (std::isinf(gbps)) return t - start_s;
    const double rate = gbps * 1e9 / 8;  // bytes a second
    const double next = i + 1 < trace.size() ? trace[i + 1].at_s : INFINITY;
    if (left <= (next - t) * rate) return t + left / rate - start_s;
    left -= (next - t) * rate;
    t = next;
  }
}

}  // namespace scd::bench
