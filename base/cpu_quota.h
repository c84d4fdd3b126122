// CpuQuotaGroups: processes each given a CPU quota of their own by the kernel's cgroup CPU
// controller (the CFS bandwidth limit), so that daemons sharing one machine behave as separate
// smaller nodes: a group may run `cpus` CPUs' worth of time per period (cpu.cfs_quota_us =
// cpus * cpu.cfs_period_us); past it, its threads wait for the next period (throttled).
// cgroup v1 only (the cpu controller mounted at /sys/fs/cgroup/cpu, as on this project's
// machines); writing there needs root. Every group lives under one subtree of the project's,
// <mount>/scd/<this process's pid>/<name>, and is removed when this object goes (processes
// still in a group are moved back to the root group first; <mount>/scd too once empty); subtrees
// left by processes that are gone (a run killed with -9) are removed when the next one is created.
// What a quota adds that an idle machine does not: a group that spends its quota early in a
// period waits for the rest of it, so a node's latency can grow by up to a period minus its quota
// (Stat reports how often that happened).
// Thread-safety: Place, Stat and Remove may be called from any thread (one lock).
#ifndef SCD_BASE_CPU_QUOTA_H_
#define SCD_BASE_CPU_QUOTA_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace scd {

constexpr char kCgroupCpuMount[] = "/sys/fs/cgroup/cpu";

// A group's throttling so far (cpu.stat).
struct CpuGroupStat {
  int64_t periods = 0;    // periods in which the group ran
  int64_t throttled = 0;  // of those, periods in which it used its whole quota and waited
  absl::Duration throttled_time;
};

class CpuQuotaGroups {
 public:
  // The subtree <mount>/scd/<pid>, created. FAILED_PRECONDITION naming why when the cpu
  // controller is not mounted there as cgroup v1 or cannot be written (not root).
  static absl::StatusOr<std::unique_ptr<CpuQuotaGroups>> Create(
      const std::string& mount = kCgroupCpuMount);
  ~CpuQuotaGroups();
  CpuQuotaGroups(const CpuQuotaGroups&) = delete;
  CpuQuotaGroups& operator=(const CpuQuotaGroups&) = delete;

  // Moves process `pid` (every thread of it, and the threads it starts later) into group `name`
  // (created on first use: [A-Za-z0-9_.-], at most 64 bytes) limited to `cpus` CPUs per `period`
  // (1 ms to 1 s; cpus * period at least 1 ms). INVALID_ARGUMENT for a bad name, quota or
  // period; NOT_FOUND when the process is gone; INTERNAL naming the file the kernel refused.
  absl::Status Place(pid_t pid, const std::string& name, double cpus,
                     absl::Duration period = absl::Milliseconds(100));
  absl::StatusOr<CpuGroupStat> Stat(const std::string& name) const;
  // The group's folder (for logs).
  std::string Path(const std::string& name) const;

 private:
  CpuQuotaGroups(std::string mount, std::string root)
      : mount_(std::move(mount)), root_(std::move(root)) {}
  // Moves what is left in `group` to the root group and removes it.
  absl::Status RemoveGroup(const std::string& group);

  const std::string mount_;
  const std::string root_;  // <mount>/scd/<pid>
  mutable absl::Mutex mu_;
  std::vector<std::string> names_ ABSL_GUARDED_BY(mu_);
};

}  // namespace scd

#endif  // SCD_BASE_CPU_QUOTA_H_
