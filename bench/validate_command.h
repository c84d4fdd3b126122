// `scd-bench validate`: the cluster simulator against real runs on emulated nodes (issue 51).
// The deployment file is the simulated twin of what runs for real: one coordinator, one producer
// pool of one node and one consumer pool (its count: the replicas), each pool's profile measured
// beforehand by `scd-bench profile`. For each workload file, the real daemons start afresh as
// the soak's deployment (bench/soak_deployment.h) with each producer and consumer in a CPU quota
// group of its own at its profile's quota (base/cpu_quota.h), the workload's requests are
// replayed at their arrival times through the coordinator (bench/sim_validation.h) while its
// faults (the soak's freezes, bench/sim_faults.h) stop and resume the real nodes at theirs, and the
// simulator runs the same workload for its seed and the next ones (the spread). Per workload:
// goodput, TTFT and TPOT p50/p90 real and simulated, the relative errors against the bounds
// (goodput 10 %, latencies 15 %), the simulated spread, the modes run, and each quota's
// throttling (what a quota adds that the simulator does not model: a node that spent its quota
// early in a period waits for the next).
// Thread-safety: call from main (the deployment's children die with the thread that made them).
#ifndef SCD_BENCH_VALIDATE_COMMAND_H_
#define SCD_BENCH_VALIDATE_COMMAND_H_

#include <CLI/CLI.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/cpu_quota.h"
#include "bench/sim_validation.h"

namespace scd::bench {

struct ValidateOptions {
  std::string deployment;                                // the simulated twin (bench/sim_config.h)
  std::vector<std::string> workloads;                    // workload files, validated in order
  std::string producer_model, consumer_model, artifact;  // what runs for real
  std::string out;                                       // validation.json, the daemons' logs
  std::string bin_dir;         // scd-coordinator, scd-producer, scd-consumer
  int seeds = 5;               // simulated runs per workload: its seed and the next ones
  double quota_period_ms = 3;  // as the profiles' (bench/profile_command.h)
  double drain_s = 300;        // the simulator's: what runs this long after the last arrival ends
  bool real = true;            // false: the simulated side only
  bool progress = true;
};

struct WorkloadValidation {
  std::string name;  // the file's stem
  SimWorkload workload;
  bool ran_real = false;
  RunFigures real;
  std::map<std::string, int64_t> real_failures;  // status code name: streams
  std::vector<std::pair<std::string, CpuGroupStat>> throttling;
  double real_s = 0;              // the real run's wall time, the deployment's start included
  RunFigures simulated;           // the workload's own seed: the same requests as the real run
  std::vector<RunFigures> seeds;  // its seed and the next ones
  std::vector<FigureSpread> spread;
  std::vector<FigureError> errors;  // when ran_real
  bool within() const;              // every error within its bound
};

// INVALID_ARGUMENT for a twin that is not one coordinator, one producer and one consumer pool,
// or a workload that does not fit it; a deployment that did not start: its status.
absl::StatusOr<std::vector<WorkloadValidation>> RunValidation(const ValidateOptions& options);
std::string ValidationJson(const std::vector<WorkloadValidation>& results);
// A Markdown table: per workload, real / simulated (seed spread) and the error of each figure.
std::string ValidationTable(const std::vector<WorkloadValidation>& results);

CLI::App* AddValidateCommand(CLI::App& app, ValidateOptions* options);
// The runs, OUT/validation.json and OUT/validation.md, the table on stdout; per workload
// OUT/NAME.real.json (`scd-bench serve`'s JSON, every stream's server timings) and
// OUT/NAME.simulated.json (`scd-bench simulate`'s, the workload's own seed).
absl::Status RunValidateCommand(ValidateOptions options);

}  // namespace scd::bench

#endif  // SCD_BENCH_VALIDATE_COMMAND_H_
