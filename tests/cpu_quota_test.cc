// CpuQuotaGroups against the kernel: a busy process placed under a quota gets no more CPU time
// than the quota allows (measured by the kernel's own accounting of the process, /proc/PID/stat),
// is throttled, and every group is gone afterwards. Needs root and cgroup v1's cpu controller (as
// on this project's machines and CI); skipped with the reason elsewhere.
#include "base/cpu_quota.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "base/child_process.h"
#include "base/file_util.h"

namespace scd {
namespace {

namespace fs = std::filesystem;

// utime + stime of `pid` (/proc/PID/stat fields 14 and 15, clock ticks).
absl::Duration CpuTime(pid_t pid) {
  absl::StatusOr<std::string> stat = ReadFileToString("/proc/" + std::to_string(pid) + "/stat");
  if (!stat.ok()) return absl::ZeroDuration();
  // Fields after the command's closing parenthesis: state is field 3.
  const std::vector<std::string> f =
      absl::StrSplit(stat->substr(stat->rfind(')') + 2), ' ', absl::SkipEmpty());
  int64_t user = 0, system = 0;
  if (f.size() < 13 || !absl::SimpleAtoi(f[11], &user) || !absl::SimpleAtoi(f[12], &system)) {
    return absl::ZeroDuration();
  }
  return absl::Seconds(static_cast<double>(user + system) /
                       static_cast<double>(sysconf(_SC_CLK_TCK)));
}

class CpuQuotaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<CpuQuotaGroups>> groups = CpuQuotaGroups::Create();
    if (!groups.ok()) GTEST_SKIP() << groups.status();
    groups_ = std::move(*groups);
  }
  std::unique_ptr<CpuQuotaGroups> groups_;
};

TEST_F(CpuQuotaTest, ABusyProcessGetsNoMoreThanItsQuotaAndIsThrottled) {
  absl::StatusOr<ChildProcess> busy =
      ChildProcess::Start({"/bin/sh", "-c", "while :; do :; done"}, "/dev/null");
  ASSERT_TRUE(busy.ok()) << busy.status();
  // A twentieth of a CPU (1 ms of every 20): however busy the machine, the loop gets that much in
  // some period, so it is throttled there.
  constexpr double kCpus = 0.05;
  const absl::Duration period = absl::Milliseconds(20);
  ASSERT_TRUE(groups_->Place(busy->pid(), "busy", kCpus, period).ok());
  const absl::Duration cpu0 = CpuTime(busy->pid());
  const absl::Time t0 = absl::Now();
  // paces: the window the quota is measured over
  absl::SleepFor(absl::Seconds(1));
  const absl::Duration cpu = CpuTime(busy->pid()) - cpu0;
  const absl::Duration wall = absl::Now() - t0;
  // The kernel lets the group run kCpus of every period: over the window at most kCpus of its
  // wall time, plus one period's quota at each end (the window starts and ends mid-period), plus
  // one clock tick of /proc's resolution at each reading. Unlimited, the loop would use ~1 s.
  const absl::Duration tick = absl::Seconds(1.0 / static_cast<double>(sysconf(_SC_CLK_TCK)));
  EXPECT_LE(cpu, kCpus * wall + 2 * kCpus * period + 2 * tick) << "over " << wall;
  absl::StatusOr<CpuGroupStat> stat = groups_->Stat("busy");
  ASSERT_TRUE(stat.ok()) << stat.status();
  EXPECT_GT(stat->throttled, 0);
  EXPECT_GT(stat->throttled_time, absl::ZeroDuration());
  EXPECT_GE(stat->periods, stat->throttled);
  // The group holds the process.
  absl::StatusOr<std::string> procs = ReadFileToString(groups_->Path("busy") + "/cgroup.procs");
  ASSERT_TRUE(procs.ok());
  EXPECT_NE(procs->find(std::to_string(busy->pid())), std::string::npos);
}

TEST_F(CpuQuotaTest, GroupsAreRemovedWithTheirProcessesMovedOutAndBadInputIsRefused) {
  absl::StatusOr<ChildProcess> sleeper = ChildProcess::Start({"/bin/sleep", "60"}, "/dev/null");
  ASSERT_TRUE(sleeper.ok());
  ASSERT_TRUE(groups_->Place(sleeper->pid(), "a", 0.5).ok());
  ASSERT_TRUE(groups_->Place(sleeper->pid(), "b", 1.5, absl::Milliseconds(50)).ok());  // moves it
  absl::StatusOr<std::string> quota = ReadFileToString(groups_->Path("b") + "/cpu.cfs_quota_us");
  ASSERT_TRUE(quota.ok());
  EXPECT_EQ(*quota, "75000\n");
  EXPECT_EQ(groups_->Place(sleeper->pid(), "../x", 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(groups_->Place(sleeper->pid(), "c", 0.001).code(),
            absl::StatusCode::kInvalidArgument);  // 100 us per 100 ms: below 1 ms
  EXPECT_EQ(groups_->Place(sleeper->pid(), "c", 1, absl::Seconds(2)).code(),
            absl::StatusCode::kInvalidArgument);
  ChildProcess gone = std::move(*ChildProcess::Start({"/bin/true"}, "/dev/null"));
  const pid_t gone_pid = gone.pid();
  gone.Wait(absl::Seconds(10));
  EXPECT_EQ(groups_->Place(gone_pid, "c", 1).code(), absl::StatusCode::kNotFound);
  const fs::path root = fs::path(groups_->Path("a")).parent_path();
  ASSERT_TRUE(fs::exists(root));
  groups_.reset();  // the sleeper still runs: moved out, then the groups removed
  EXPECT_FALSE(fs::exists(root));
  absl::StatusOr<std::string> procs =
      ReadFileToString(std::string(kCgroupCpuMount) + "/cgroup.procs");
  ASSERT_TRUE(procs.ok());
  EXPECT_NE(procs->find(std::to_string(sleeper->pid())), std::string::npos);
}

}  // namespace
}  // namespace scd
