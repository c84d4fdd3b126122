// Model steps running at once, and the BLAS pool: a step running alone gets every BLAS thread;
// while several run, each runs its BLAS calls on its own thread.
//
// Debian's libtorch runs GEMMs and GEMVs in OpenBLAS, whose one pthread pool (--threads threads,
// model/runtime.h) serves every caller in the process, and whose workers and waiting callers
// busy-wait. Requests calling into that pool at once fight over it: with 2 BLAS threads on 2 cores
// `scd serve` turned out 941 tokens/s for one request in flight and 60 for eight (issue 14).
// Turning the pool off (one thread for everything) avoids the fight but halves a lone request's
// prefill. So every model step (a Forward, a layer's rebuild, a layer's encoding) is marked with a
// ComputeStep, and the process counts the steps running: while one runs, it has the pool; when a
// second starts, the pool is set to one thread and every step computes on its own thread, side by
// side on the cores, none waiting on the pool; when one is left, it gets the pool back. At most one
// step ever uses the pool. Tokens/s of C concurrent requests is then at least that of one (same
// work per token, none of it fighting, more of it in parallel: bench/README.md). Batching the
// decode steps of several requests into one GEMM is a later issue.
//
// A step that blocks (a producer's layer callback waiting for transfer credit) steps aside with
// ComputeStep::Paused, so it does not keep the others off the pool. Steps nest: code inside a
// step may mark itself again at no cost.
//
// The switch is installed by ConfigureThreads (SetBlasSharing); without it (OpenMP or MKL builds,
// a library user that never configured threads) steps are only counted.
//
// Thread-safety: thread-safe. A ComputeStep (and a Paused) must end on the thread that began it.
#ifndef SCD_MODEL_COMPUTE_STEPS_H_
#define SCD_MODEL_COMPUTE_STEPS_H_

#include <cstdint>
#include <functional>

namespace scd {

class ComputeStep {
 public:
  ComputeStep();  // this thread runs a model step (nested: no-op)
  ~ComputeStep();
  ComputeStep(const ComputeStep&) = delete;
  ComputeStep& operator=(const ComputeStep&) = delete;

  // Steps this thread's step aside for the scope (a blocking call inside a step): it does not
  // count as running meanwhile. A no-op on a thread running no step.
  class Paused {
   public:
    Paused();
    ~Paused();
    Paused(const Paused&) = delete;
    Paused& operator=(const Paused&) = delete;

   private:
    int depth_ = 0;
  };
};

// Inside the scope every BLAS call of the process runs on its calling thread (the pool is set to
// one thread, as when steps run side by side), and BLAS's own workers stay asleep: for code that
// shares its work over the compute pool itself (model/skinny_gemm.h) and calls BLAS from each
// part, such as a packed model's prefill attention. OpenBLAS's idle workers yield-spin for a
// while after each call; beside the compute pool's threads on the same cores they took ~10 % of
// an 8-bit prefill (bench/README.md). Nests; a no-op without the switch (SetBlasSharing).
class BlasOnCallingThreads {
 public:
  BlasOnCallingThreads();
  ~BlasOnCallingThreads();
  BlasOnCallingThreads(const BlasOnCallingThreads&) = delete;
  BlasOnCallingThreads& operator=(const BlasOnCallingThreads&) = delete;
};

// `share(true)` when a second step starts beside a running one (every step: one BLAS thread),
// `share(false)` when one is left (it gets the pool). Called under the counter's lock: it must be
// quick and must not start a step. Null: steps are only counted.
void SetBlasSharing(std::function<void(bool shared)> share);

// Whether steps run side by side now (the BLAS pool is shared): a lock-free read for code that
// parallelises by itself (model/skinny_gemm.h).
bool ComputeStepsShared();

struct ComputeStepStats {
  int64_t steps = 0;    // outermost steps begun (and resumed after a pause)
  int64_t shared = 0;   // times the pool was split because steps ran side by side
  int running = 0;      // now
  int max_running = 0;  // the most at once
};
ComputeStepStats GetComputeStepStats();

}  // namespace scd

#endif  // SCD_MODEL_COMPUTE_STEPS_H_
