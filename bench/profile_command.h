// `scd-bench profile`: a producer's and a consumer's node profile (bench/node_profile.h), measured
// on real daemons each under a CPU quota of its own (base/cpu_quota.h) -- the costs the cluster
// simulator charges. A deployment as the soak's (bench/soak_deployment.h: etcd, a coordinator,
// the producer, one consumer with the pair's artifact, one compute thread each) serves, through
// the public API:
//   1. prompts of several lengths, one at a time, in local and in scd mode, in groups sharing
//      half their tokens (the first of a group misses the prefix caches, the rest hit them): the
//      prefills, encodings, transfers, rebuilds and first decodes (Finished.timings);
//   1b. a prompt of each length twice, local then scd, sent at idle_gap_ms spacing, so that each
//      finds the deployment idle: what work costs after idle (NodeProfile.idle);
//   2. batches of 1..B requests at once in local mode at two prompt lengths: decode steps by the
//      sequences and context they carry (the gaps between tokens, bench/profile_fit.h);
//   3. a stream of requests arriving while others decode, local then scd: what prompt work costs
//      the decodes beside it (the consumer's own NodeStats).
// Phases 1, 1b and 2 run `runs` times; the fits (bench/profile_fit.h, to each shape's median) make
// OUT/producer.toml and OUT/consumer.toml; OUT/profile.json
// holds every sample, every fit with its residual, and each node's throttling by its quota (the
// periods it spent its quota early and waited: what a quota adds that an unshared CPU does not).
// Thread-safety: call from main (the deployment's children die with the thread that made them).
#ifndef SCD_BENCH_PROFILE_COMMAND_H_
#define SCD_BENCH_PROFILE_COMMAND_H_

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/cpu_quota.h"
#include "bench/profile_fit.h"

namespace scd::bench {

struct ProfileOptions {
  std::string producer_model, consumer_model;  // model directories
  std::string artifact;                        // the producer -> consumer artifact
  std::string out;                             // profiles, profile.json, the daemons' logs
  std::string bin_dir;                         // scd-coordinator, scd-producer, scd-consumer
  std::string transport = "grpc";
  double producer_cpus = 0.5, consumer_cpus = 0.5;  // 0: unlimited
  // The quotas' period (base/cpu_quota.h): short, so that a node's time is spread as a smaller
  // CPU's would be, not run at full speed and then stopped for most of the period. At 10 ms a
  // decode step or short prefill of a few ms ran whole inside one period's quota (full speed)
  // while a longer one stalled (half speed): costs that no line fits. The kernel grants at
  // least 1 ms a period (0.5 CPUs: periods of 2 ms and up) and charges a running task at its
  // tick (4 ms at HZ=250), so a period much shorter than the tick gains nothing; 3 ms measured
  // the least scatter (bench/README.md).
  double quota_period_ms = 3;
  std::vector<int> prompt_lens;  // empty: 8 .. the context's half
  std::vector<int> batches = {1, 2, 4, 8};
  int output_len = 64;  // the step phase averages the later half: 32 gaps a sample
  int repeats = 3;  // prompt groups per length and mode
  // Phase 1b's spacing: prompts after ~240 ms of idle took 1.15-1.6x their busy cost, after
  // ~55 ms a few percent more (bench/README.md), what a lightly loaded deployment's requests
  // meet. 0: no phase 1b.
  double idle_gap_ms = 300;
  // Times phases 1 and 2 run on the deployment; each cost is fitted to the median of its shape's
  // samples (bench/profile_fit.h MedianByShape). Two profiles of one run each differed by up to
  // 50 % in a step's cost (a one-sequence step: 2.3 to 3.5 ms): a quota'd pass scatters by a
  // period and a tick, and a stall lands on whichever sample it meets.
  int runs = 3;
  uint64_t seed = 1;
  bool progress = true;
};

struct ProfileReport {
  ProfileFitInput input;
  // The fits, or why they could not be made (too few samples of a cost, a cost of 0): the
  // samples are reported either way.
  absl::StatusOr<ProfileFitResult> fit;
  // Positions the producer counted computing (NodeStats.prefill_tokens) and what the samples
  // say it computed (prompt - 1 - cached each): equal when the fit's n is the pass's.
  int64_t producer_counted_tokens = 0, producer_sample_tokens = 0;
  int runs = 1;                                                  // of phases 1 and 2
  std::vector<std::pair<std::string, CpuGroupStat>> throttling;  // per node with a quota
  double seconds = 0;
};

// Runs the three phases and fits. INVALID_ARGUMENT for bad options; a request that failed or a
// deployment that did not start: its status, naming it.
absl::StatusOr<ProfileReport> RunProfile(const ProfileOptions& options);
// Every sample, fit and throttling count, and the two profiles' TOML.
std::string ProfileJson(const ProfileReport& report);

// Adds `profile` to `app`, bound to `options`; returns the subcommand.
CLI::App* AddProfileCommand(CLI::App& app, ProfileOptions* options);
// The run, profile.json and the two profiles under options.out, a summary on stdout; the fit's
// error after profile.json is written.
absl::Status RunProfileCommand(ProfileOptions options);

}  // namespace scd::bench

#endif  // SCD_BENCH_PROFILE_COMMAND_H_
