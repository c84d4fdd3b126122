// `scd-bench kills` (issue 50): a consumer killed mid-decode while another replica of its model is
// alive, many times over, on real daemons (bench/soak_deployment.h: etcd, one coordinator, the
// producer, two replicas of the fine-tune `fables`). Each round one request -- local and raw in
// turn, greedy and seeded sampling (temperature 0.8, top-p 0.9) in turn -- is served once
// unfaulted for its reference, then again; once its first token has arrived, the replica decoding
// it (the one whose Stats shows a sequence) gets SIGKILL, and the stream must go on at the other
// replica (GenerateEvent.Moved) with the tokens the unfaulted run gave. Measured per round: the gap
// the kill left in the client's stream (the last token before the Moved to the first after it),
// whether the tokens equal the reference, how long the killed replica stayed routed to after the
// kill, and, once restarted, how long until it was routed to again. A round whose stream ended
// before a replica showed its sequence kills nothing and is run again on the next prompt.
// Thread-safety: RunKillBench from the main thread (it starts child processes).
#ifndef SCD_BENCH_KILL_BENCH_H_
#define SCD_BENCH_KILL_BENCH_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bench/serve_benchmark.h"

namespace scd::bench {

struct KillBenchOptions {
  std::string bin_dir;     // the daemons
  std::string shared_dir;  // models/ and data/
  std::string out;         // the nodes' logs, kills.json
  int kills = 50;          // rounds that killed a replica mid-decode
  uint32_t max_tokens = 256;
  std::string transport = "grpc";
  absl::Duration gap_bound = absl::Seconds(1);  // the p99 the issue asks of the move's gap
  bool progress = true;
};

struct KillRound {
  int prompt = 0;
  std::string mode;  // local | raw
  bool greedy = true;
  bool killed = false;          // a replica was decoding it and was killed
  std::string victim;           // its node name
  int tokens_before_kill = -1;  // tokens the client had when the kill was sent
  int moves = 0;                // Moved events the stream got
  bool finished = false;
  std::string error;   // the stream's error, or what else went wrong
  double gap_s = -1;   // last token before the Moved -> first token after it
  bool equal = false;  // ids equal the unfaulted run's
  int tokens = 0, reference_tokens = 0;
  double out_of_routing_s = -1;  // kill -> the coordinator no longer lists the replica
  double routed_again_s = -1;    // restarted (ready) -> listed again
};

struct KillBenchReport {
  KillBenchOptions options;
  std::vector<KillRound> rounds;  // every round, the ones that killed nothing too
  int killed = 0, moved = 0, equal = 0, finished = 0;
  MetricSummary gap, out_of_routing, routed_again;  // over the rounds that killed
  bool pass() const;  // every kill moved, finished equal, gap p99 within the bound
};

class SoakDeployment;
// One round on a running deployment: round `round`'s request (local and raw in turn, greedy and
// seeded in turn; the prompt `round` modulo prompts) served once unfaulted, then again with the
// replica of `replicas` (deployment node indexes) decoding it killed at its first token, and
// that replica restarted after the stream ended. RunKillBench's rounds; also what a test that
// needs a moved stream calls.
KillRound RunKillRound(SoakDeployment& d, const std::string& coordinator,
                       const std::vector<int>& replicas, const KillBenchOptions& o,
                       const std::vector<std::string>& prompts, int round);

// INVALID_ARGUMENT for bad options; the deployment's failure to start.
absl::StatusOr<KillBenchReport> RunKillBench(const KillBenchOptions& options);
std::string KillBenchJson(const KillBenchReport& report);
std::string KillBenchSummary(const KillBenchReport& report);

}  // namespace scd::bench

#endif  // SCD_BENCH_KILL_BENCH_H_
