#include "bench/soak_check.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace scd::bench {
namespace {

constexpr size_t kExamples = 40;

std::string CodeName(int code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

std::string FaultLabel(const FaultOutcome& f) {
  return f.node.empty() ? FaultKindName(f.fault.kind)
                        : absl::StrCat(FaultKindName(f.fault.kind), " ", SoakRoleName(f.role));
}

bool Overlaps(const FaultWindow& w, absl::Time from, absl::Time to) {
  return from <= w.to && w.from <= to;
}

}  // namespace

const char* StreamOutcomeName(StreamOutcome outcome) {
  switch (outcome) {
    case StreamOutcome::kOk:
      return "ok";
    case StreamOutcome::kClientEnded:
      return "client_ended";
    case StreamOutcome::kDeadline:
      return "deadline";
    case StreamOutcome::kExplained:
      return "explained";
    case StreamOutcome::kUnexplained:
      return "unexplained";
  }
  return "?";
}

std::vector<FaultWindow> FaultWindows(const std::vector<FaultOutcome>& faults, absl::Time run_end,
                                      absl::Duration grace) {
  std::vector<FaultWindow> windows;
  for (const FaultOutcome& f : faults) {
    const absl::Time end = f.recovered == absl::InfinitePast() ? run_end : f.recovered;
    windows.push_back({f, f.start, end + grace});
  }
  return windows;
}

bool OnPath(const FaultOutcome& fault, const SoakRecord& record, const SoakStream& stream) {
  const bool transfer = record.spec.mode != "local";
  const bool via = record.coordinator == fault.address ||
                   std::find(record.resumed_via.begin(), record.resumed_via.end(), fault.address) !=
                       record.resumed_via.end();
  switch (fault.fault.kind) {
    case FaultKind::kEtcd:
      return true;
    case FaultKind::kFlap:
    case FaultKind::kLinkDown:  // the producer's link
      return transfer;
    case FaultKind::kReplace:
      return via;
    case FaultKind::kKill:
    case FaultKind::kFreeze:
      switch (fault.role) {
        case SoakRole::kConsumer: {
          if (stream.target == fault.model) return true;
          // Refused as a whole (no target started, the call's status): one target without a
          // live consumer refuses every target (inference.proto, UNAVAILABLE).
          bool refused = record.rpc_code != 0;
          for (const SoakStream& s : record.streams) refused = refused && s.started == 0;
          return refused && std::find(record.spec.targets.begin(), record.spec.targets.end(),
                                      fault.model) != record.spec.targets.end();
        }
        case SoakRole::kProducer:
          return transfer;
        case SoakRole::kCoordinator:
          return via;
        case SoakRole::kEtcd:
          return true;
      }
  }
  return false;
}

namespace {

// Whether a replica of `w`'s consumer model other than the faulted one was in no consumer
// fault's window over the request.
bool ReplicaLeft(const FaultWindow& w, const std::vector<FaultWindow>& windows,
                 const SoakRecord& record, const SoakReplicas& replicas) {
  const auto it = replicas.find(w.fault.model);
  int left = (it == replicas.end() ? 1 : it->second) - 1;
  for (const FaultWindow& o : windows) {
    const bool down =
        o.fault.fault.kind == FaultKind::kKill || o.fault.fault.kind == FaultKind::kFreeze;
    if (&o == &w || !down || o.fault.role != SoakRole::kConsumer ||
        o.fault.model != w.fault.model) {
      continue;
    }
    if (Overlaps(o, record.sent, record.ended)) --left;
  }
  return left > 0;
}

}  // namespace

bool Explains(const FaultWindow& w, const std::vector<FaultWindow>& windows,
              const SoakRecord& record, const SoakStream& stream, const SoakReplicas& replicas) {
  if (!Overlaps(w, record.sent, record.ended) || !OnPath(w.fault, record, stream)) return false;
  switch (w.fault.fault.kind) {
    case FaultKind::kEtcd:
      return false;
    case FaultKind::kFlap:
    case FaultKind::kLinkDown:
      return record.spec.forbid_fallback;
    case FaultKind::kReplace:
      return !record.resume_blocked.empty();
    case FaultKind::kKill:
    case FaultKind::kFreeze:
      switch (w.fault.role) {
        case SoakRole::kConsumer:
          return !ReplicaLeft(w, windows, record, replicas);
        case SoakRole::kProducer:
          return record.spec.forbid_fallback;
        case SoakRole::kCoordinator:
          return w.fault.fault.kind == FaultKind::kFreeze || !record.resume_blocked.empty();
        case SoakRole::kEtcd:
          return false;
      }
  }
  return false;
}

StreamJudgement JudgeStream(const SoakRecord& record, const SoakStream& stream,
                            const std::vector<FaultWindow>& windows, absl::Duration deadline_bound,
                            const SoakReplicas& replicas) {
  StreamJudgement j;
  const FaultWindow* explaining = nullptr;
  bool on_path = false;  // a fault that could have broken it
  for (const FaultWindow& w : windows) {
    on_path =
        on_path || (Overlaps(w, record.sent, record.ended) && OnPath(w.fault, record, stream));
    if (explaining == nullptr && Explains(w, windows, record, stream, replicas)) explaining = &w;
  }
  // The server must end every request it holds by its deadline (plus the bound); a client that
  // left, or a fault on the path (a frozen coordinator cannot answer, a move takes time), excuses
  // it.
  const absl::Duration took = record.ended - record.sent;
  const bool late = took > absl::Milliseconds(record.spec.deadline_ms) + deadline_bound;
  j.deadline_overrun = late && !record.client_ended && !on_path;
  if (stream.finished) {
    j.outcome = StreamOutcome::kOk;
    return j;
  }
  const auto code = static_cast<absl::StatusCode>(stream.code);
  if (record.client_ended &&
      (code == absl::StatusCode::kCancelled || code == absl::StatusCode::kDeadlineExceeded)) {
    j.outcome = StreamOutcome::kClientEnded;
  } else if (record.spec.short_deadline && code == absl::StatusCode::kDeadlineExceeded && !late) {
    j.outcome = StreamOutcome::kDeadline;
  } else if (explaining != nullptr) {
    j.outcome = StreamOutcome::kExplained;
    j.explained_by =
        absl::StrCat(FaultLabel(explaining->fault), explaining->fault.node.empty() ? "" : " ",
                     explaining->fault.node);
  } else {
    j.outcome = StreamOutcome::kUnexplained;
  }
  return j;
}

namespace {

// How a stream went on: moved (resumes among them) or fell back to local prefill.
void CountMoves(const SoakStream& s, SoakTally& t) {
  if (s.moves > 0) {
    ++t.moved;
    t.moves += s.moves;
  } else if (s.finished && s.started_mode != "local" && s.mode == "local") {
    ++t.fallbacks;
  }
  if (s.resumes > 0) {
    ++t.resumed;
    t.resumes += s.resumes;
  }
}

}  // namespace

SoakTally TallySoak(const std::vector<SoakRecord>& records, const std::vector<FaultWindow>& windows,
                    absl::Duration deadline_bound, const SoakReplicas& replicas) {
  SoakTally t;
  std::vector<double> ttft_steady, ttft_faults, itl_steady, itl_faults, move_gaps;
  for (const SoakRecord& r : records) {
    ++t.requests;
    t.violations += static_cast<int64_t>(r.violations.size());
    for (const std::string& v : r.violations) {
      if (t.examples.size() < kExamples) {
        t.examples.push_back(absl::StrCat(r.spec.request_id, " via ", r.coordinator, ": ", v));
      }
    }
    bool in_fault = false;
    for (const FaultWindow& w : windows) in_fault = in_fault || Overlaps(w, r.sent, r.ended);
    for (const SoakStream& s : r.streams) {
      ++t.streams;
      const StreamJudgement j = JudgeStream(r, s, windows, deadline_bound, replicas);
      ++t.outcomes[StreamOutcomeName(j.outcome)];
      if (!s.finished) ++t.failure_codes[CodeName(s.code)];
      if (j.outcome == StreamOutcome::kExplained) {
        ++t.explained_by_kind[j.explained_by.substr(0, j.explained_by.rfind(' '))];
      }
      if (s.compared) ++t.compared;
      if (s.compared && !s.tokens.ok) ++t.wrong_tokens;
      if (s.compared && s.tokens.near_tie) ++t.near_tie_partings;
      if (s.lowered) ++t.lowered;
      CountMoves(s, t);
      move_gaps.insert(move_gaps.end(), s.move_gap_s.begin(), s.move_gap_s.end());
      if (r.rpc_code == 0 && s.terminals == 0) ++t.no_terminal;
      const double over_ms =
          absl::ToDoubleMilliseconds(r.ended - r.sent) - static_cast<double>(r.spec.deadline_ms);
      if (!r.client_ended && !in_fault) {
        t.max_deadline_overrun_ms = std::max(t.max_deadline_overrun_ms, over_ms);
      }
      if (j.deadline_overrun) {
        ++t.deadline_overruns;
        if (t.examples.size() < kExamples) {
          t.examples.push_back(absl::StrCat(r.spec.request_id, " ", s.target, ": ended ", over_ms,
                                            " ms past its deadline of ", r.spec.deadline_ms,
                                            " ms"));
        }
      }
      if (j.outcome == StreamOutcome::kUnexplained && t.examples.size() < kExamples) {
        t.examples.push_back(absl::StrCat(
            r.spec.request_id, " ", s.target, " (", r.spec.mode, ") via ", r.coordinator,
            r.resumed_via.empty() ? "" : " then " + absl::StrJoin(r.resumed_via, ", "),
            r.resume_blocked.empty() ? "" : " (not resumed: " + r.resume_blocked + ")",
            ": unexplained ", CodeName(s.code), ": ", s.error));
      }
      if (s.ttft_s >= 0) (in_fault ? ttft_faults : ttft_steady).push_back(s.ttft_s);
      if (r.spec.read_pace == absl::ZeroDuration()) {  // a slow reader's ITL is its own pace
        for (double gap : s.itl_s) (in_fault ? itl_faults : itl_steady).push_back(gap);
      }
    }
  }
  const std::vector<double> p = {50, 90, 99};
  t.ttft_steady = Summarize(ttft_steady, p);
  t.ttft_faults = Summarize(ttft_faults, p);
  t.itl_steady = Summarize(itl_steady, p);
  t.itl_faults = Summarize(itl_faults, p);
  t.move_gap = Summarize(move_gaps, p);
  return t;
}

RssGrowth MeasureRssGrowth(const std::vector<RssPoint>& points) {
  std::map<int, std::vector<const RssPoint*>> by_generation;
  for (const RssPoint& p : points) by_generation[p.generation].push_back(&p);
  const std::vector<const RssPoint*>* longest = nullptr;
  RssGrowth growth;
  for (const auto& [generation, list] : by_generation) {
    if (longest == nullptr ||
        list.back()->at - list.front()->at > longest->back()->at - longest->front()->at) {
      longest = &list;
      growth.generation = generation;
    }
  }
  if (longest == nullptr || longest->size() < 8) return growth;
  const std::vector<const RssPoint*> span(longest->begin() + longest->size() / 4, longest->end());
  // Least-squares slope of `bytes` against requests ended, in MiB per 1,000 requests.
  auto slope = [&span](int64_t RssPoint::*bytes) {
    double mean_x = 0, mean_y = 0;
    for (const RssPoint* p : span) {
      mean_x += static_cast<double>(p->requests);
      mean_y += static_cast<double>(p->*bytes);
    }
    mean_x /= static_cast<double>(span.size());
    mean_y /= static_cast<double>(span.size());
    double cov = 0, var = 0;
    for (const RssPoint* p : span) {
      const double dx = static_cast<double>(p->requests) - mean_x;
      cov += dx * (static_cast<double>(p->*bytes) - mean_y);
      var += dx * dx;
    }
    return var > 0 ? cov / var * 1000 / (1 << 20) : 0.0;
  };
  growth.requests = span.back()->requests - span.front()->requests;
  growth.mb_per_1k = slope(&RssPoint::rss);
  growth.anon_mb_per_1k = slope(&RssPoint::anon);
  return growth;
}

}  // namespace scd::bench
