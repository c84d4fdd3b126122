#include "base/work_queue.h"

#include <utility>

#include "base/thread_name.h"

namespace scd {

WorkQueue::WorkQueue(int threads, std::string name) {
  for (int i = 0; i < (threads < 1 ? 1 : threads); ++i)
    threads_.emplace_back([this, name] {
      NameThisThread(name.c_str());
      Work();
    });
}

WorkQueue::~WorkQueue() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void WorkQueue::Run(std::function<void()> job) {
  absl::MutexLock lock(&mu_);
  jobs_.push_back(std::move(job));
}

size_t WorkQueue::queued() const {
  absl::MutexLock lock(&mu_);
  return jobs_.size();
}

void WorkQueue::Work() {
  for (;;) {
    std::function<void()> job;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !jobs_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (jobs_.empty()) return;  // stopping, and nothing left to run
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
  }
}

}  // namespace scd
