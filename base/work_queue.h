// WorkQueue: a fixed number of threads running queued jobs in order of arrival. For work that
// blocks while it runs (a producer's prefill: the forward pass and the sends of its layers),
// which must not run on gRPC's callback threads and must not take a thread per request either:
// requests beyond the threads wait in the queue, holding nothing but their job.
// Thread-safety: Run is thread-safe; the destructor runs every job still queued, then joins.
#ifndef SCD_BASE_WORK_QUEUE_H_
#define SCD_BASE_WORK_QUEUE_H_

#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace scd {

class WorkQueue {
 public:
  // `threads` >= 1, each named `name` (base/thread_name.h).
  explicit WorkQueue(int threads, std::string name = "scd-work");
  ~WorkQueue();
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // Queues `job`; it runs on one of the queue's threads.
  void Run(std::function<void()> job);
  // Jobs queued and not started.
  size_t queued() const;
  int threads() const { return static_cast<int>(threads_.size()); }

 private:
  void Work();

  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> jobs_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace scd

#endif  // SCD_BASE_WORK_QUEUE_H_
