// base/work_queue.h: jobs run on exactly the queue's threads, at most that many at once, in order
// of arrival on one thread; the destructor runs what is still queued.
#include "base/work_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

namespace scd {
namespace {

TEST(WorkQueue, AtMostItsThreadsAtOnceAndEveryJobRuns) {
  std::atomic<int> running{0}, most{0}, done{0};
  absl::Mutex mu;
  std::set<std::thread::id> seen;
  {
    WorkQueue queue(3);
    EXPECT_EQ(queue.threads(), 3);
    for (int i = 0; i < 40; ++i) {
      queue.Run([&] {
        const int now = ++running;
        int before = most.load();
        while (now > before && !most.compare_exchange_weak(before, now)) {
        }
        // paces: each task works 2 ms so tasks overlap (the scenario)
        absl::SleepFor(absl::Milliseconds(2));
        {
          absl::MutexLock lock(&mu);
          seen.insert(std::this_thread::get_id());
        }
        --running;
        ++done;
      });
    }
  }  // the destructor runs what is left
  EXPECT_EQ(done.load(), 40);
  EXPECT_LE(most.load(), 3);
  EXPECT_LE(seen.size(), 3u);
}

TEST(WorkQueue, OneThreadRunsJobsInOrderOfArrival) {
  std::vector<int> order;
  absl::Notification started, gate;
  {
    WorkQueue queue(1);
    queue.Run([&] {
      started.Notify();
      gate.WaitForNotification();
    });
    started.WaitForNotification();
    for (int i = 0; i < 10; ++i) queue.Run([&order, i] { order.push_back(i); });
    EXPECT_EQ(queue.queued(), 10u);  // behind the first, which waits
    gate.Notify();
  }
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
}

}  // namespace
}  // namespace scd
