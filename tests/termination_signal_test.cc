// CatchTerminationSignals / WaitForTerminationSignal in forked children (gtest death tests): a
// SIGTERM the kernel hands to a thread that started before them (as OpenBLAS's workers do, from
// a load-time constructor) is still a drain, not a kill by the default action.
#include "base/termination_signal.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace scd {
namespace {

// Exit statuses a child reports with.
constexpr int kGotSigterm = 10;
constexpr int kGotSigint = 11;
constexpr int kGotOther = 12;

int ExitFor(const std::string& name) {
  if (name == "SIGTERM") return kGotSigterm;
  if (name == "SIGINT") return kGotSigint;
  return kGotOther;
}

// A thread with the default signal mask, started before CatchTerminationSignals and running
// until the child exits: the kernel's only candidate for a signal every other thread blocks.
void StartForeignThread() {
  std::thread([] {
    for (;;) pause();
  }).detach();
}

TEST(TerminationSignalDeathTest, ASigtermOnAForeignThreadWhileMainIsBusyIsADrain) {
  EXPECT_EXIT(
      {
        StartForeignThread();
        CatchTerminationSignals();
        kill(getpid(), SIGTERM);  // main blocks it and is not waiting: the foreign thread gets it
        // paces: main is busy ("loading a model") while the foreign thread takes the signal
        absl::SleepFor(absl::Milliseconds(200));
        _exit(ExitFor(WaitForTerminationSignal()));
      },
      ::testing::ExitedWithCode(kGotSigterm), "");
}

TEST(TerminationSignalDeathTest, ASignalPendingWhileEveryThreadBlocksItEndsTheWait) {
  EXPECT_EXIT(
      {
        CatchTerminationSignals();
        kill(getpid(), SIGINT);  // the only thread blocks it: pending until the wait unblocks
        _exit(ExitFor(WaitForTerminationSignal()));
      },
      ::testing::ExitedWithCode(kGotSigint), "");
}

TEST(TerminationSignalDeathTest, ASignalWhileWaitingEndsTheWait) {
  EXPECT_EXIT(
      {
        StartForeignThread();
        CatchTerminationSignals();
        std::thread([] {
          // waits: main to block in the wait before the signal comes (no event says a thread is in
          //  sigwait); a signal before it is the pending case, which also passes
          absl::SleepFor(absl::Milliseconds(100));
          kill(getpid(), SIGTERM);
        }).detach();
        _exit(ExitFor(WaitForTerminationSignal()));
      },
      ::testing::ExitedWithCode(kGotSigterm), "");
}

TEST(TerminationSignalDeathTest, ThreadsStartedAfterCatchingBlockBothSignals) {
  EXPECT_EXIT(
      {
        CatchTerminationSignals();
        std::atomic<int> blocked{0};
        std::thread([&blocked] {
          sigset_t mask;
          pthread_sigmask(SIG_BLOCK, nullptr, &mask);
          blocked = sigismember(&mask, SIGTERM) + sigismember(&mask, SIGINT);
        }).join();
        _exit(blocked.load());
      },
      ::testing::ExitedWithCode(2), "");
}

}  // namespace
}  // namespace scd
