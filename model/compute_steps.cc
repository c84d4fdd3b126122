// One process-wide counter under a mutex; the BLAS switch is made under the same lock when the
// count crosses one, so the pool's setting always matches what runs. Each thread counts how deep
// it is in steps (nesting).
#include "model/compute_steps.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace scd {
namespace {

std::atomic<bool> shared_now{false};  // Counter::shared, for lock-free readers

struct Counter {
  absl::Mutex mu;
  int running ABSL_GUARDED_BY(mu) = 0;
  int calling_threads ABSL_GUARDED_BY(mu) = 0;  // BlasOnCallingThreads scopes open
  bool shared ABSL_GUARDED_BY(mu) = false;        // steps side by side
  bool blas_split ABSL_GUARDED_BY(mu) = false;    // the BLAS pool at one thread
  std::function<void(bool)> share ABSL_GUARDED_BY(mu);
  ComputeStepStats stats ABSL_GUARDED_BY(mu);

  void Update() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const bool now_shared = running > 1;
    if (now_shared != shared) {
      shared = now_shared;
      shared_now.store(shared, std::memory_order_relaxed);
      if (shared) ++stats.shared;
    }
    const bool split = shared || calling_threads > 0;
    if (split == blas_split) return;
    blas_split = split;
    if (share) share(split);
  }
};

Counter& TheCounter() {
  static Counter* counter = new Counter();  // never destroyed: steps may run at exit
  return *counter;
}

thread_local int depth = 0;  // steps this thread is in (nested)

void Begin() {
  Counter& c = TheCounter();
  absl::MutexLock lock(&c.mu);
  ++c.stats.steps;
  ++c.running;
  c.stats.max_running = std::max(c.stats.max_running, c.running);
  c.Update();
}

void End() {
  Counter& c = TheCounter();
  absl::MutexLock lock(&c.mu);
  --c.running;
  c.Update();
}

}  // namespace

ComputeStep::ComputeStep() {
  if (depth++ == 0) Begin();
}

ComputeStep::~ComputeStep() {
  if (--depth == 0) End();
}

ComputeStep::Paused::Paused() : depth_(depth) {
  if (depth_ == 0) return;
  depth = 0;
  End();
}

ComputeStep::Paused::~Paused() {
  if (depth_ == 0) return;
  Begin();
  depth = depth_;
}

BlasOnCallingThreads::BlasOnCallingThreads() {
  Counter& c = TheCounter();
  absl::MutexLock lock(&c.mu);
  ++c.calling_threads;
  c.Update();
}

BlasOnCallingThreads::~BlasOnCallingThreads() {
  Counter& c = TheCounter();
  absl::MutexLock lock(&c.mu);
  --c.calling_threads;
  c.Update();
}

void SetBlasSharing(std::function<void(bool shared)> share) {
  Counter& c = TheCounter();
  absl::MutexLock lock(&c.mu);
  c.share = std::move(share);
  c.shared = false;  // the caller set the pool up for one step
  c.blas_split = false;
  shared_now.store(false, std::memory_order_relaxed);
  c.Update();        // steps running already (unusual): match them
}

bool ComputeStepsShared() { return shared_now.load(std::memory_order_relaxed); }

ComputeStepStats GetComputeStepStats() {
  Counter& c = TheCounter();
  absl::MutexLock lock(&c.mu);
  ComputeStepStats stats = c.stats;
  stats.running = c.running;
  return stats;
}

}  // namespace scd
