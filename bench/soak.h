// `scd-bench soak` (bench/README.md "Soak under faults"): a long mixed load on a deployment of
// real daemons while a fault schedule kills, freezes and restarts them, flaps the producer's
// link and restarts etcd -- every request checked as it ends, every fault's recovery measured,
// and at the end, with the load stopped, nothing held anywhere and every process's descriptors,
// threads and resident memory against their level before the load.
//
//   1. artifacts for the pairs (a quick fit with scd-calib, kept in OUT/artifacts), the prompt
//      pool, and the references: each (prompt, target, mode) served alone by `scd serve
//      --all-in-one` (bench/soak_workload.h);
//   2. the deployment (bench/soak_deployment.h): etcd, two coordinators, the producer
//      (stories260k), three consumers -- two replicas of the fine-tune (`fables`) and the
//      independently trained model (`xs`); a warm-up through every coordinator, then each
//      process's baseline;
//   3. the load: requests drawn by DrawSoakRequest arriving as a Poisson process, each on a
//      worker thread (bench/soak_client.h), sent to the live coordinators in turn and resumed
//      through another when theirs goes away; meanwhile the fault cycles (bench/soak_faults.h),
//      a steady gap between faults;
//   4. the end: the load stops, in-flight requests end, every node must hold nothing (Stats)
//      within 30 s; descriptors and threads against the baseline; RSS growth per 1,000 requests
//      of each process's longest-lived incarnation; the verdict (bench/soak_check.h's contract: a
//      failure is explained only where nothing live could have carried the stream; and enough
//      moves, resumes and fallbacks that the run tested them), soak.json and soak.png.
// Thread-safety: RunSoak from the main thread (it starts child processes).
#ifndef SCD_BENCH_SOAK_H_
#define SCD_BENCH_SOAK_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bench/soak_check.h"
#include "bench/soak_deployment.h"
#include "bench/soak_faults.h"

namespace scd::bench {

struct SoakOptions {
  std::string bin_dir;                          // scd, scd-calib, the daemons
  std::string shared_dir;                       // models/ and data/
  std::string out;                              // logs, artifacts, soak.json, soak.png
  absl::Duration duration = absl::Minutes(30);  // the load
  double rate = 6;                              // requests per second (Poisson)
  int workers = 96;                             // requests in flight at most
  uint64_t seed = 1;
  absl::Duration fault_gap = absl::Seconds(20);  // steady time between faults
  std::string transport = "grpc";
  // The producer's link: "shaper" (loopback; the flap shapes it) or "netns" (a network namespace
  // of its own, root: every cycle also takes it down and up).
  std::string link = "shaper";
  absl::Duration deadline_bound = absl::Seconds(1);  // a server-side end past the deadline
  absl::Duration grace = absl::Seconds(2);           // after a fault's recovery
  // RSS growth is judged for a process incarnation that saw at least this many requests
  // between its measured points (reported for every one).
  int64_t rss_min_requests = 2000;
  double rss_bound_mb_per_1k = 1.0;
  // A run counts only where streams did go on past their faults: at least this many moves to
  // another replica, resumes through another coordinator and local fallbacks (0: reported only,
  // as in the smoke, whose few faults may meet no stream).
  int min_moves = 20, min_resumes = 5, min_fallbacks = 10;
  bool progress = true;
};

// One process slot at the end against its baseline.
struct NodeResources {
  std::string name;
  SoakRole role = SoakRole::kConsumer;
  int generation = 0;  // the incarnation running at the end
  // Descriptors and threads: the lowest of several reads (bench/soak.cc Levels).
  ProcSample baseline;  // first incarnation, after the warm-up, nothing held
  ProcSample end;       // after the load, nothing held, once back (or 30 s on)
  bool held_nothing = true;
  std::string held;  // what it still held, when it did
  // RSS growth of the longest-lived incarnation, per 1,000 requests of the run, from a quarter
  // of its life on (MeasureRssGrowth, bench/soak_check.h).
  double rss_growth_mb_per_1k = 0;
  double rss_anon_growth_mb_per_1k = 0;  // of it, anonymous pages (reported, not judged)
  int64_t rss_requests = 0;  // requests over that span
  int rss_generation = 0;
};

struct SoakReport {
  SoakOptions options;
  absl::Time load_start, load_end;
  double settle_s = -1;  // load stopped -> every node held nothing (-1: never, within 30 s)
  // Then -> every process's descriptors and threads at or below their baseline (-1: not within
  // 30 s).
  double levels_back_s = -1;
  std::vector<SoakRecord> records;
  std::vector<FaultOutcome> faults;
  std::vector<FaultWindow> windows;
  SoakReplicas replicas;  // consumers per routing name, for the judge
  SoakTally tally;
  std::vector<NodeResources> nodes;
  std::vector<std::string> fault_kinds_run;
  std::vector<std::string> failures;  // why the verdict is "fail"; empty: pass
  bool pass() const { return failures.empty(); }
};

// INVALID_ARGUMENT for bad options; a setup failure's status (artifacts, references, the
// deployment). A run that finds faults returns its report with `failures` filled.
absl::StatusOr<SoakReport> RunSoak(const SoakOptions& options);

// soak.json: options, verdict, tallies, faults with their recoveries, nodes, per-stream rows
// (times since the load's start) for the plot.
std::string SoakJson(const SoakReport& report);
// A few lines for stdout.
std::string SoakSummaryText(const SoakReport& report);

}  // namespace scd::bench

#endif  // SCD_BENCH_SOAK_H_
