#include "bench/bandwidth_trace.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "proto/wire_mode.h"

namespace scd::bench {
namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

nlohmann::json Rate(double gbps) {
  return std::isfinite(gbps) ? nlohmann::json(gbps) : nlohmann::json("inf");
}

// Replays `trace` from `start` on a thread of its own until stopped. A step is in force from
// the moment the coordinator confirmed it (its Registry.SetLinkShape returned), not from its
// scheduled time: a request started in between still travels at the rate before it.
class TracePlayer {
 public:
  // Steps at or before `from_s` (the first included) are the caller's to have set.
  TracePlayer(const SweepOptions& o, const std::vector<TraceStep>& trace, absl::Time start,
              double from_s = 0)
      : thread_([this, &o, &trace, start, from_s] {
          for (size_t i = 1; i < trace.size(); ++i) {
            if (trace[i].at_s <= from_s) continue;
            if (done_.WaitForNotificationWithDeadline(start + absl::Seconds(trace[i].at_s))) {
              return;
            }
            const absl::Status s = SetCoordinatorShape(o, trace[i].gbps, o.trace_unannounced);
            absl::MutexLock lock(&mu_);
            if (!s.ok()) {
              if (error_.ok()) error_ = s;
              return;
            }
            applied_.push_back({absl::ToDoubleSeconds(absl::Now() - start), trace[i].gbps});
          }
        }) {}
  ~TracePlayer() { Stop().IgnoreError(); }  // an early return already has its error
  // Stops the replay; the first error (a producer that did not take a shape).
  absl::Status Stop() {
    if (!done_.HasBeenNotified()) done_.Notify();
    if (thread_.joinable()) thread_.join();
    absl::MutexLock lock(&mu_);
    return error_;
  }
  // The steps as applied: their confirmed times. REQUIRES: stopped.
  std::vector<TraceStep> Applied() {
    absl::MutexLock lock(&mu_);
    return applied_;
  }

 private:
  absl::Notification done_;
  absl::Mutex mu_;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::vector<TraceStep> applied_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // last: started once the rest is built
};

// Index of the step in force at `t` in `applied` (ascending times).
int StepAt(const std::vector<TraceStep>& applied, double t) {
  int step = 0;
  for (size_t i = 0; i < applied.size(); ++i) {
    if (applied[i].at_s <= t) step = static_cast<int>(i);
  }
  return step;
}

// What came back for `rec`'s request.
void FillRecord(const SweepOptions& o, const SweepReply& r, TraceRecord* rec) {
  rec->ok = r.finished;
  rec->error = r.error;
  if (!r.finished) return;
  rec->mode_used = RanModeName(r.f);
  rec->choice = ChoiceText(r.started, r.f);
  rec->ttft_ms = static_cast<double>(r.f.timings().ttft()) / 1e3;
  rec->client_ttft_ms = r.client_ttft_us / 1e3;
  rec->predicted_ttft_ms = static_cast<double>(r.f.predicted_ttft_us()) / 1e3;
  rec->payload_bytes = r.f.payload_bytes();
  rec->lowered_layers = r.f.lowered_layers_size();
  rec->expected_kl = r.started.expected_kl();
  const double slo = o.judge_ttft_ms > 0 ? o.judge_ttft_ms : o.ttft_slo_ms;
  rec->met_slo = slo > 0 && rec->ttft_ms <= slo;
}

// The paired replay of auto's records [first, end): each sent again at its instant of `applied`
// (the steps as auto's pass confirmed them) as the fixed mode auto chose, appended to `records`.
absl::Status ReplayKept(const SweepOptions& o, const std::vector<TraceStep>& applied,
                        size_t first, size_t end, std::vector<TraceRecord>* records) {
  for (size_t i = first; i < end; ++i) {
    const TraceRecord a = (*records)[i];  // a copy: the vector grows below
    TraceRecord rec;
    rec.consumer = a.consumer;
    rec.mode = kKeptReplayMode;
    rec.prompt = a.prompt;
    rec.replay_of = static_cast<int>(i);
    rec.start_s = a.start_s;
    rec.step = a.step;
    rec.gbps_start = a.gbps_start;
    if (!a.ok) {
      rec.error = "not replayed: auto's request failed";
      records->push_back(std::move(rec));
      continue;
    }
    if (absl::Status s = SetCoordinatorShape(o, a.gbps_start, o.trace_unannounced); !s.ok()) {
      return s;
    }
    const absl::Time start = absl::Now() - absl::Seconds(a.start_s);
    TracePlayer player(o, applied, start, a.start_s);
    const SweepReply r = SendSweepRequest(o, a.consumer, a.mode_used, o.prompts[a.prompt],
                                          a.mode_used == "scd" ? a.expected_kl : 0);
    rec.end_s = absl::ToDoubleSeconds(absl::Now() - start);
    if (absl::Status s = player.Stop(); !s.ok()) return s;
    FillRecord(o, r, &rec);
    rec.gbps_end = RateAt(applied, rec.end_s);
    records->push_back(std::move(rec));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<TraceRecord>> RunBandwidthTrace(const SweepOptions& o,
                                                          const std::vector<TraceStep>& trace,
                                                          double hold_s) {
  if (trace.empty() || o.modes.empty() || o.consumers.empty() || o.prompts.empty() ||
      !(hold_s >= 0)) {
    return absl::InvalidArgumentError(
        "the trace needs steps, modes, consumers, prompts and a hold >= 0");
  }
  if (absl::Status s = ValidateSweepModes(o.modes); !s.ok()) return s;
  const bool replay = o.trace_paired;
  if (replay && std::find(o.modes.begin(), o.modes.end(), "auto") == o.modes.end()) {
    return absl::InvalidArgumentError("the paired replay replays auto's requests: --modes auto");
  }
  const double duration = trace.back().at_s + hold_s;
  std::vector<TraceRecord> records;
  int done = 0;
  const int total = static_cast<int>(o.consumers.size() * (o.modes.size() + replay));
  for (const std::string& consumer : o.consumers) {
    for (const std::string& mode : o.modes) {
      if (o.on_progress) o.on_progress(done++, total, absl::StrCat(consumer, " ", mode));
      if (absl::Status s = SetCoordinatorShape(o, trace.front().gbps); !s.ok()) return s;
      // One request first, not recorded: the first after a start pays for cold caches and
      // allocations (and auto has measured nothing), which would weigh on this pass alone.
      const SweepReply warm = SendSweepRequest(o, consumer, mode, o.prompts.front());
      if (!warm.finished) {
        return absl::UnavailableError(
            absl::StrCat("the trace's warm-up request (", consumer, ", ", mode, ") failed: ",
                         warm.error));
      }
      const absl::Time start = absl::Now();
      TracePlayer player(o, trace, start);
      auto since = [start] { return absl::ToDoubleSeconds(absl::Now() - start); };
      const size_t first = records.size();
      for (int p = 0; since() < duration; ++p) {
        TraceRecord rec;
        rec.consumer = consumer;
        rec.mode = mode;
        rec.prompt = p % static_cast<int>(o.prompts.size());
        rec.start_s = since();
        const SweepReply r = SendSweepRequest(o, consumer, mode, o.prompts[rec.prompt]);
        rec.end_s = since();
        FillRecord(o, r, &rec);
        records.push_back(std::move(rec));
      }
      if (absl::Status s = player.Stop(); !s.ok()) return s;
      std::vector<TraceStep> applied = {{0, trace.front().gbps}};
      for (const TraceStep& step : player.Applied()) applied.push_back(step);
      for (size_t i = first; i < records.size(); ++i) {
        TraceRecord& rec = records[i];
        rec.step = StepAt(applied, rec.start_s);
        rec.gbps_start = applied[static_cast<size_t>(rec.step)].gbps;
        rec.gbps_end = applied[static_cast<size_t>(StepAt(applied, rec.end_s))].gbps;
      }
      if (replay && mode == "auto") {
        if (o.on_progress) {
          o.on_progress(done++, total, absl::StrCat(consumer, " ", kKeptReplayMode));
        }
        const size_t end = records.size();
        if (absl::Status s = ReplayKept(o, applied, first, end, &records); !s.ok()) return s;
      }
    }
  }
  if (absl::Status s = SetCoordinatorShape(o, INFINITY); !s.ok()) return s;
  return records;
}

std::string TraceJsonl(const std::vector<TraceRecord>& records) {
  std::string out;
  for (const TraceRecord& r : records) {
    const nlohmann::json j = {
        {"consumer", r.consumer},
        {"mode", r.mode},
        {"mode_used", r.mode_used},
        {"choice", r.choice},
        {"prompt", r.prompt},
        {"ok", r.ok},
        {"error", r.error},
        {"start_s", r.start_s},
        {"end_s", r.end_s},
        {"step", r.step},
        {"gbps_start", Rate(r.gbps_start)},
        {"gbps_end", Rate(r.gbps_end)},
        {"ttft_ms", r.ttft_ms},
        {"client_ttft_ms", r.client_ttft_ms},
        {"predicted_ttft_ms", r.predicted_ttft_ms},
        {"payload_bytes", r.payload_bytes},
        {"lowered_layers", r.lowered_layers},
        {"met_slo", r.met_slo},
        {"expected_kl", r.expected_kl},
        {"replay_of", r.replay_of},
    };
    absl::StrAppend(&out, j.dump(), "\n");
  }
  return out;
}

std::string TraceSummaryCsv(const std::vector<TraceRecord>& records,
                            const std::vector<TraceStep>& trace) {
  std::string out =
      "consumer,mode,step,from_s,gbps,requests,failed,ttft_ms,predicted_ttft_ms,met_slo,"
      "lowered,choices\n";
  std::vector<std::pair<std::string, std::string>> order;
  for (const TraceRecord& r : records) {
    if (std::find(order.begin(), order.end(), std::make_pair(r.consumer, r.mode)) == order.end()) {
      order.emplace_back(r.consumer, r.mode);
    }
  }
  for (const auto& [consumer, mode] : order) {
    for (size_t i = 0; i < trace.size(); ++i) {
      const double from = trace[i].at_s;
      std::vector<double> ttft, predicted;
      int requests = 0, failed = 0, met_slo = 0, lowered = 0;
      std::map<std::string, int> choices;
      for (const TraceRecord& r : records) {
        if (r.consumer != consumer || r.mode != mode || r.step != static_cast<int>(i)) continue;
        ++requests;
        if (!r.ok) {
          ++failed;
          continue;
        }
        ttft.push_back(r.ttft_ms);
        met_slo += r.met_slo;
        lowered += r.lowered_layers > 0;
        if (r.predicted_ttft_ms > 0) predicted.push_back(r.predicted_ttft_ms);
        ++choices[r.choice];
      }
      absl::StrAppendFormat(&out, "%s,%s,%d,%g,%s,%d,%d,%.3f,%s,%d,%d,\"%s\"\n", consumer, mode,
                            static_cast<int>(i), from, RateText(trace[i].gbps), requests, failed,
                            Median(ttft),
                            predicted.empty() ? "" : absl::StrFormat("%.3f", Median(predicted)),
                            met_slo, lowered,
                            absl::StrJoin(choices, "; ", absl::PairFormatter(": ")));
    }
  }
  return out;
}

std::string TracePairsCsv(const std::vector<TraceRecord>& records) {
  std::string out =
      "consumer,pairs,point_pairs,same_point,within_adapted,within_kept,point_within_adapted,"
      "point_within_kept,point_lowered,point_ttft_ms_adapted,point_ttft_ms_kept,"
      "point_bytes_adapted,point_bytes_kept\n";
  struct Tally {
    int pairs = 0, point_pairs = 0, same_point = 0, within[2] = {0, 0}, point_within[2] = {0, 0};
    int lowered = 0;
    std::vector<double> ttft[2], bytes[2];
  };
  std::map<std::string, Tally> by_consumer;
  std::vector<std::string> order;
  for (const TraceRecord& b : records) {
    if (b.replay_of < 0 || static_cast<size_t>(b.replay_of) >= records.size()) continue;
    const TraceRecord& a = records[static_cast<size_t>(b.replay_of)];
    if (!a.ok || !b.ok) continue;
    if (!by_consumer.count(b.consumer)) order.push_back(b.consumer);
    Tally& t = by_consumer[b.consumer];
    ++t.pairs;
    const TraceRecord* both[2] = {&a, &b};
    const bool point = a.mode_used == "scd";
    t.point_pairs += point;
    t.same_point += point && a.choice == b.choice;
    t.lowered += point && a.lowered_layers > 0;
    for (int k = 0; k < 2; ++k) {
      t.within[k] += both[k]->met_slo;
      if (!point) continue;
      t.point_within[k] += both[k]->met_slo;
      t.ttft[k].push_back(both[k]->ttft_ms);
      t.bytes[k].push_back(static_cast<double>(both[k]->payload_bytes));
    }
  }
  for (const std::string& consumer : order) {
    const Tally& t = by_consumer[consumer];
    absl::StrAppendFormat(&out, "%s,%d,%d,%d,%d,%d,%d,%d,%d,%.1f,%.1f,%.0f,%.0f\n", consumer,
                          t.pairs, t.point_pairs, t.same_point, t.within[0], t.within[1],
                          t.point_within[0], t.point_within[1], t.lowered, Median(t.ttft[0]),
                          Median(t.ttft[1]), Median(t.bytes[0]), Median(t.bytes[1]));
  }
  return out;
}

}  // namespace scd::bench
