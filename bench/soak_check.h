// What `scd-bench soak` concludes from its records (bench/soak.h): each stream's outcome judged
// against the fault schedule -- finished; ended by its own client (cancelled, abandoned); ended
// by its short deadline within the bound; failed and explained by a fault; or failed unexplained
// -- and the run's tallies: outcomes, violations of the per-request invariants, wrong-token
// streams, deadline overruns, moves, resumes and fallbacks, and TTFT / ITL percentiles in steady
// periods against during faults.
// A fault's window runs from its start to its recovery (or the end of the run) plus a grace for
// what was already on its way. A fault is on a stream's path (OnPath: it could have broken it)
// when it hit the stream's consumer model (a consumer; any of a fan-out's targets' when the
// request was refused as a whole), any request that needs a transfer (the producer, the link),
// a coordinator the request went through (kill, freeze, replace), or anything (etcd). It
// explains a failure (Explains) only where nothing live could have carried the stream (issue
// 50's contract): a consumer's kill or freeze only when every other replica of its model (if
// any) was in a fault window of its own over the request; the producer's death or its link's flap
// only for a request that forbade the local fallback; a coordinator's kill or replacement only when
// the client could not resume (SoakRecord::resume_blocked); a coordinator's freeze always (its
// streams wait, the client cannot tell it from a slow one); etcd's restart never (routing goes
// on from what each coordinator holds).
// RSS growth: the least-squares slope of a process's resident bytes against the requests the run
// has ended, over its longest-lived incarnation from a quarter of its life on (the first quarter
// is its warm-up: caches filling, pools growing to the load). A slope, not two samples' difference:
// the daemons hand freed memory back every 10 s (base/process_memory.h), so RSS saws by a few MB.
// Thread-safety: pure functions over their arguments.
#ifndef SCD_BENCH_SOAK_CHECK_H_
#define SCD_BENCH_SOAK_CHECK_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "bench/serve_benchmark.h"
#include "bench/soak_client.h"
#include "bench/soak_faults.h"

namespace scd::bench {

enum class StreamOutcome { kOk, kClientEnded, kDeadline, kExplained, kUnexplained };
const char* StreamOutcomeName(StreamOutcome outcome);

struct FaultWindow {
  FaultOutcome fault;
  absl::Time from, to;
};
// Each fault's window: [start, recovered (`run_end` when it never recovered) + grace].
std::vector<FaultWindow> FaultWindows(const std::vector<FaultOutcome>& faults, absl::Time run_end,
                                      absl::Duration grace);

// Routing name -> the deployment's consumers of it (a name absent: one).
using SoakReplicas = std::map<std::string, int>;

// Whether `fault` is on the path of `stream` of `record`: it could have broken it.
bool OnPath(const FaultOutcome& fault, const SoakRecord& record, const SoakStream& stream);
// Whether window `w`'s fault explains `stream` of `record` failing: on its path, and nothing live
// could have carried it (the header's contract; `windows`: every fault's, for the replicas out).
bool Explains(const FaultWindow& w, const std::vector<FaultWindow>& windows,
              const SoakRecord& record, const SoakStream& stream, const SoakReplicas& replicas);

struct StreamJudgement {
  StreamOutcome outcome = StreamOutcome::kOk;
  std::string explained_by;       // the fault, "kill consumer-1" (explained only)
  bool deadline_overrun = false;  // ended past its deadline + the bound, unexplained
};
// `deadline_bound`: how late past deadline_ms a server-side end may come (a fault on the path
// excuses it).
StreamJudgement JudgeStream(const SoakRecord& record, const SoakStream& stream,
                            const std::vector<FaultWindow>& windows, absl::Duration deadline_bound,
                            const SoakReplicas& replicas = {});

struct SoakTally {
  int64_t requests = 0, streams = 0;
  std::map<std::string, int64_t> outcomes;           // StreamOutcomeName -> streams
  std::map<std::string, int64_t> failure_codes;      // "UNAVAILABLE" -> streams (not ok)
  std::map<std::string, int64_t> explained_by_kind;  // "kill consumer" -> streams
  int64_t compared = 0, wrong_tokens = 0, near_tie_partings = 0, lowered = 0;
  int64_t fallbacks = 0;    // served locally after asking a transfer
  int64_t moved = 0;        // streams that went on at another replica (Moved events)
  int64_t moves = 0;        // Moved events, resumes included
  int64_t resumed = 0;      // streams resumed through another coordinator
  int64_t resumes = 0;      // their Moved (resumed) events
  int64_t violations = 0;   // per-request invariants broken (wrong tokens included)
  int64_t no_terminal = 0;  // streams of calls that ended OK without their terminal event
  int64_t deadline_overruns = 0;
  double max_deadline_overrun_ms = 0;  // the latest server-side end past its deadline
  std::vector<std::string> examples;   // the first violations and unexplained failures
  MetricSummary ttft_steady, ttft_faults, itl_steady, itl_faults;
  MetricSummary move_gap;  // last token before a move to the first after it
};
SoakTally TallySoak(const std::vector<SoakRecord>& records, const std::vector<FaultWindow>& windows,
                    absl::Duration deadline_bound, const SoakReplicas& replicas = {});

struct RssPoint {
  int generation = 0;  // the process's incarnation
  absl::Time at;
  int64_t rss = 0, requests = 0;  // requests ended so far in the run
  int64_t anon = 0;               // of rss, anonymous pages (ResidentOf: not the libraries')
};
struct RssGrowth {
  double mb_per_1k = 0;       // MiB per 1,000 requests
  double anon_mb_per_1k = 0;  // of it, anonymous pages (over the same span)
  int64_t requests = 0;  // requests over the span measured (0: too few samples)
  int generation = 0;    // the incarnation measured
};
RssGrowth MeasureRssGrowth(const std::vector<RssPoint>& points);

}  // namespace scd::bench

#endif  // SCD_BENCH_SOAK_CHECK_H_
