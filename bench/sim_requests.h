// SimRequests: the requests a simulated workload (bench/sim_config.h) sends, drawn one at a time
// in arrival order from its seed -- the same sequence in every process for a seed (the engine and
// distributions are libstdc++'s, fixed for this build). Each request carries what routing and the
// prefix caches see of its prompt: the routing keys of its full prefix blocks (base/prefix_hash.h
// kPrefixBlockTokens positions each), the first of them its tenant's group's shared prefix (the
// share of its prompt the workload gives; two requests of one group share the blocks both
// reach), the rest its own.
// Thread-safety: not thread-safe (one simulation owns it).
#ifndef SCD_BENCH_SIM_REQUESTS_H_
#define SCD_BENCH_SIM_REQUESTS_H_

#include <cstdint>
#include <initializer_list>
#include <random>
#include <vector>

#include "bench/sim_config.h"

namespace scd::bench {

// A 64-bit mix of the words (splitmix64's finalizer over a running sum): keys and seeds that are
// the same exactly when the words are (routing keys of simulated blocks, a replay's id streams).
uint64_t SimKey(std::initializer_list<uint64_t> words);

struct SimRequest {
  uint64_t id = 0;
  double arrival_s = 0;  // since the run's start
  int64_t prompt_tokens = 0, output_tokens = 0;
  size_t mix = 0;                // index into the workload's mix
  int64_t tenant = 0;            // its cache salt
  int64_t group = -1;            // its shared-prefix group (-1: none)
  std::vector<uint64_t> blocks;  // routing keys of the prompt's full blocks
  int64_t shared_blocks = 0;     // of them, the group's shared prefix
};

class SimRequests {
 public:
  explicit SimRequests(const SimWorkload& workload);
  // The next request, or false once the next would arrive past the workload's duration.
  bool Next(SimRequest* out);

 private:
  int64_t Length(const SimLengths& lengths);
  double Gap();

  const SimWorkload& w_;
  std::mt19937_64 rng_;
  double now_s_ = 0, total_weight_ = 0;
  uint64_t next_id_ = 0;
};

// Every request the workload sends (SimRequests for its seed), in arrival order.
std::vector<SimRequest> DrawSimRequests(const SimWorkload& workload);

}  // namespace scd::bench

#endif  // SCD_BENCH_SIM_REQUESTS_H_
