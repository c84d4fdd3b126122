// Model steps running at once and the BLAS pool: a step alone has it, steps side by side each run
// on one thread, a paused step does not count; and the real OpenBLAS pool follows
// (openblas_get_num_threads) once ConfigureThreads installed the switch.
#include "model/compute_steps.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "model/runtime.h"

namespace scd {
namespace {

// Records every switch the counter makes.
class Switches {
 public:
  Switches() {
    SetBlasSharing([this](bool shared) {
      absl::MutexLock lock(&mu_);
      seen_.push_back(shared);
    });
  }
  ~Switches() { SetBlasSharing(nullptr); }
  std::vector<bool> seen() {
    absl::MutexLock lock(&mu_);
    return seen_;
  }

 private:
  absl::Mutex mu_;
  std::vector<bool> seen_ ABSL_GUARDED_BY(mu_);
};

// Runs `body` inside a step on another thread, between two notifications.
class StepThread {
 public:
  StepThread()
      : thread_([this] {
          ComputeStep step;
          inside_.Notify();
          leave_.WaitForNotification();
        }) {
    inside_.WaitForNotification();
  }
  ~StepThread() { Leave(); }
  void Leave() {
    if (!leave_.HasBeenNotified()) leave_.Notify();
    if (thread_.joinable()) thread_.join();
  }

 private:
  absl::Notification inside_, leave_;
  std::thread thread_;
};

TEST(ComputeStepsTest, ALoneStepKeepsThePoolASecondSplitsItTheLastGetsItBack) {
  Switches switches;
  {
    ComputeStep first;
    EXPECT_TRUE(switches.seen().empty());
    { ComputeStep nested; }  // inside a step: no new step
    EXPECT_TRUE(switches.seen().empty());
    EXPECT_EQ(GetComputeStepStats().running, 1);
    {
      StepThread second;
      EXPECT_EQ(switches.seen(), std::vector<bool>({true}));
      EXPECT_EQ(GetComputeStepStats().running, 2);
      StepThread third;  // already split: no second switch
      EXPECT_EQ(switches.seen(), std::vector<bool>({true}));
      third.Leave();
      EXPECT_EQ(switches.seen(), std::vector<bool>({true}));
    }
    EXPECT_EQ(switches.seen(), std::vector<bool>({true, false}));
  }
  EXPECT_EQ(switches.seen(), std::vector<bool>({true, false}));
  EXPECT_EQ(GetComputeStepStats().running, 0);
  EXPECT_GE(GetComputeStepStats().max_running, 3);
}

TEST(ComputeStepsTest, APausedStepDoesNotCount) {
  Switches switches;
  ComputeStep mine;
  StepThread other;
  EXPECT_EQ(switches.seen(), std::vector<bool>({true}));
  {
    ComputeStep::Paused paused;  // e.g. waiting for transfer credit
    EXPECT_EQ(switches.seen(), std::vector<bool>({true, false}));
    EXPECT_EQ(GetComputeStepStats().running, 1);
  }
  EXPECT_EQ(switches.seen(), std::vector<bool>({true, false, true}));
  other.Leave();
  EXPECT_EQ(switches.seen(), std::vector<bool>({true, false, true, false}));
}

TEST(ComputeStepsTest, PausingWithoutAStepDoesNothing) {
  Switches switches;
  { ComputeStep::Paused paused; }
  EXPECT_TRUE(switches.seen().empty());
  EXPECT_EQ(GetComputeStepStats().running, 0);
}

// The real pool: ConfigureThreads(2) installs the switch on Debian's OpenBLAS (pthreads).
TEST(ComputeStepsTest, OpenBlasPoolFollowsTheSteps) {
  using GetThreads = int (*)();
  auto get = reinterpret_cast<GetThreads>(::dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  const ThreadSettings settings = ConfigureThreads(2);
  if (get == nullptr || settings.blas != "openblas-pthreads") {
    GTEST_SKIP() << "no separate OpenBLAS pool here: " << settings.ToString();
  }
  EXPECT_EQ(get(), 2);
  {
    ComputeStep mine;
    EXPECT_EQ(get(), 2);
    StepThread other;
    EXPECT_EQ(get(), 1);
  }
  EXPECT_EQ(get(), 2);
  SetBlasSharing(nullptr);
}

}  // namespace
}  // namespace scd
