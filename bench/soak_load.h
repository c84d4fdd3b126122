// The load of `scd-bench soak` (bench/soak.h) while the faults run: requests drawn by
// DrawSoakRequest (bench/soak_workload.h) arriving as a Poisson process, each followed on a
// worker thread by RunSoakRequest (bench/soak_client.h) and sent to the live coordinators in
// turn, a stream whose coordinator goes away resuming through another live one; a warm-up burst
// before it; and a sampler that reads every process's resident memory every 2 s and draws the
// progress bar. Thread-safety: SoakLoad's counters may be read from any thread; Start/Finish from
// one. SoakSampler::SetFault from any thread; Start/Stop from one.
#ifndef SCD_BENCH_SOAK_LOAD_H_
#define SCD_BENCH_SOAK_LOAD_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "base/work_queue.h"
#include "bench/soak_check.h"
#include "bench/soak_client.h"
#include "bench/soak_deployment.h"
#include "bench/soak_workload.h"

namespace scd::bench {

// What every request is checked against: the prompts, their references, the near-tie bound.
struct SoakChecks {
  const std::vector<std::string>* prompts = nullptr;
  const SoakReferences* references = nullptr;
  double tie = 0;
};

// Every live coordinator at once: `per_coordinator` requests in flight together, mixed targets
// and modes, so that each coordinator reaches every consumer replica and the producer every
// consumer (the connections a loaded deployment keeps) before the baseline is read.
void SoakWarmUp(const SoakDeployment& d, const std::vector<std::string>& targets,
                const SoakChecks& checks, int per_coordinator);

class SoakLoad {
 public:
  SoakLoad(const SoakDeployment& d, const SoakMix& mix, const SoakChecks& checks, double rate,
           int workers, uint64_t seed);
  ~SoakLoad();
  // Requests arrive until `end`.
  void Start(absl::Time end);
  // Waits for the arrivals to end and every request sent to end; their records.
  std::vector<SoakRecord> Finish();
  int64_t sent() const { return sent_.load(); }
  int64_t completed() const { return completed_.load(); }
  int64_t not_ok() const { return not_ok_.load(); }  // failed, not by their client's doing

 private:
  void Arrivals(absl::Time end);
  SoakRecord Run(const SoakRequestSpec& spec, const std::string& coordinator);

  const SoakDeployment& d_;
  const SoakMix mix_;
  const SoakChecks checks_;
  const double rate_;
  const uint64_t seed_;
  SoakCanceller canceller_;
  std::unique_ptr<WorkQueue> workers_;
  std::thread thread_;
  std::atomic<int64_t> sent_{0}, completed_{0}, not_ok_{0};
  std::mutex mu_;
  std::vector<SoakRecord> records_ ABSL_GUARDED_BY(mu_);
};

class SoakSampler {
 public:
  SoakSampler(const SoakDeployment& d, const SoakLoad& load, absl::Duration duration,
              bool progress);
  void Start(absl::Time start);
  void SetFault(std::string what);
  // Stops; every node's samples (by node index).
  std::vector<std::vector<RssPoint>> Stop();

 private:
  void Loop(absl::Time start);

  const SoakDeployment& d_;
  const SoakLoad& load_;
  const absl::Duration duration_;
  const bool progress_;
  std::vector<std::vector<RssPoint>> points_;  // the sampler's thread's until Stop
  std::mutex mu_;
  std::string fault_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace scd::bench

#endif  // SCD_BENCH_SOAK_LOAD_H_
