// ChildProcess: argv run without a shell, the exit status and the output come back, the
// environment changes apply, and only descriptors 0-2 reach the child -- one this process opened
// without O_CLOEXEC (an ifstream does) must not live on in it.
#include "base/child_process.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <string>

namespace scd {
namespace {

TEST(ChildProcessTest, RunReturnsTheExitStatusAndTheOutput) {
  absl::StatusOr<ChildProcess::Outcome> out =
      ChildProcess::Run({"/bin/sh", "-c", "echo out; echo err >&2; exit 3"});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->status, 3);
  EXPECT_NE(out->output.find("out\n"), std::string::npos) << out->output;
  EXPECT_NE(out->output.find("err\n"), std::string::npos) << out->output;
  EXPECT_EQ(out->ending, "exited with status 3");
}

// A child that dies by a signal (CI once saw a plot script end so, with no output) says which.
TEST(ChildProcessTest, RunNamesTheSignalThatEndedTheChild) {
  absl::StatusOr<ChildProcess::Outcome> out = ChildProcess::Run({"/bin/sh", "-c", "kill -9 $$"});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->status, -1);
  EXPECT_EQ(out->ending, "killed by signal 9 (Killed)");
  absl::StatusOr<ChildProcess::Outcome> slow =
      ChildProcess::Run({"/bin/sleep", "30"}, absl::Milliseconds(50));
  ASSERT_TRUE(slow.ok()) << slow.status();
  EXPECT_EQ(slow->status, -1);
  EXPECT_EQ(slow->ending, "still running after the timeout (SIGKILLed)");
}

TEST(ChildProcessTest, ADescriptorOpenedWithoutCloexecDoesNotReachTheChild) {
  const int opened = open("/dev/null", O_RDONLY);  // no O_CLOEXEC, as std::ifstream opens
  ASSERT_GE(opened, 0);
  constexpr int kFd = 200;
  ASSERT_EQ(dup2(opened, kFd), kFd);  // dup2's copy never has FD_CLOEXEC
  close(opened);
  absl::StatusOr<ChildProcess::Outcome> out = ChildProcess::Run(
      {"/bin/sh", "-c", "if [ -e /proc/self/fd/200 ]; then echo leaked; else echo clean; fi"});
  close(kFd);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->status, 0);
  EXPECT_EQ(out->output, "clean\n");
}

TEST(ChildProcessTest, StartAppliesTheEnvironmentChanges) {
  setenv("SCD_CHILD_TEST_GONE", "x", 1);
  const std::string log = "/tmp/scd-child-process-test-" + std::to_string(getpid()) + ".log";
  absl::StatusOr<ChildProcess> child =
      ChildProcess::Start({"/bin/sh", "-c", "echo \"[$SCD_CHILD_TEST_SET][$SCD_CHILD_TEST_GONE]\""},
                          log, {"SCD_CHILD_TEST_SET=yes", "SCD_CHILD_TEST_GONE="},
                          /*stdout_to_log=*/true);
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_EQ(child->Wait(absl::Seconds(30)), 0);
  EXPECT_EQ(child->LogTail(), "[yes][]\n");
  std::remove(log.c_str());
  unsetenv("SCD_CHILD_TEST_GONE");
}

TEST(ChildProcessTest, HowItEndedTellsAnExitFromASignalFromATimeout) {
  const std::string log = "/tmp/scd-child-process-test-" + std::to_string(getpid()) + ".log";
  absl::StatusOr<ChildProcess> exits = ChildProcess::Start({"/bin/sh", "-c", "exit 4"}, log);
  ASSERT_TRUE(exits.ok()) << exits.status();
  EXPECT_EQ(exits->HowItEnded(), "running");
  EXPECT_EQ(exits->Wait(absl::Seconds(30)), 4);
  EXPECT_EQ(exits->HowItEnded(), "exited with status 4");
  // sh -c exec: the signal reaches sleep itself, whose default action ends it.
  absl::StatusOr<ChildProcess> killed =
      ChildProcess::Start({"/bin/sh", "-c", "exec sleep 60"}, log);
  ASSERT_TRUE(killed.ok()) << killed.status();
  EXPECT_EQ(killed->Terminate(absl::Seconds(30)), -1);
  EXPECT_EQ(killed->HowItEnded(), "killed by signal 15 (Terminated)");
  // A child that ignores SIGTERM outlives the timeout.
  std::remove(log.c_str());  // what it writes is all the log will hold
  absl::StatusOr<ChildProcess> stuck =
      ChildProcess::Start({"/bin/sh", "-c", "trap '' TERM; echo up; sleep 60"}, log,
                          /*env=*/{}, /*stdout_to_log=*/true);
  ASSERT_TRUE(stuck.ok()) << stuck.status();
  ASSERT_EQ(stuck->WaitForFile(log, absl::Seconds(30)).value_or(""), "up");  // the trap is set
  EXPECT_EQ(stuck->Terminate(absl::Milliseconds(200)), -1);
  EXPECT_EQ(stuck->HowItEnded(), "still running after the timeout (SIGKILLed)");
  std::remove(log.c_str());
}

}  // namespace
}  // namespace scd
