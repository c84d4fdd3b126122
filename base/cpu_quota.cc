#include "base/cpu_quota.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/file_util.h"
#include "base/status_macros.h"

namespace scd {
namespace {

namespace fs = std::filesystem;

// One value written to a control file in one write(2): the kernel's refusal is its errno.
absl::Status WriteControl(const std::string& path, const std::string& value) {
  const int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  const ssize_t wrote = write(fd, value.data(), value.size());
  const int error = errno;
  close(fd);
  if (wrote == static_cast<ssize_t>(value.size())) return absl::OkStatus();
  const std::string why = absl::StrCat("writing '", value, "' to ", path, ": ",
                                       wrote < 0 ? std::strerror(error) : "short write");
  return wrote < 0 && error == ESRCH ? absl::NotFoundError(why) : absl::InternalError(why);
}

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > 64 || name == "." || name == "..") return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != '-') {
      return false;
    }
  }
  return true;
}

// The processes in a group's cgroup.procs.
std::vector<std::string> Procs(const std::string& group) {
  absl::StatusOr<std::string> text = ReadFileToString(group + "/cgroup.procs");
  if (!text.ok()) return {};
  return absl::StrSplit(*text, '\n', absl::SkipWhitespace());
}

// Moves every process of `group` to the root group `mount` and removes the folder; a process
// that is ending may hold it a moment (EBUSY), so this retries for up to a second.
absl::Status MoveOutAndRemove(const std::string& mount, const std::string& group) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    for (const std::string& pid : Procs(group)) {
      WriteControl(mount + "/cgroup.procs", pid).IgnoreError();  // gone already: fine
    }
    if (rmdir(group.c_str()) == 0 || errno == ENOENT) return absl::OkStatus();
    if (errno != EBUSY) {
      return absl::InternalError(absl::StrCat("cannot remove ", group, ": ", std::strerror(errno)));
    }
    usleep(10000);  // paces: a process leaving the group
  }
  return absl::InternalError(absl::StrCat("cannot remove ", group, ": still busy after 1 s"));
}

// Removes <scd>/<pid> subtrees whose process is gone (a run killed before its destructor ran).
void RemoveStale(const std::string& mount, const std::string& scd) {
  std::error_code ec;
  for (const fs::directory_entry& owner : fs::directory_iterator(scd, ec)) {
    int pid = 0;
    if (!owner.is_directory(ec) || !absl::SimpleAtoi(owner.path().filename().string(), &pid) ||
        pid <= 0 || kill(pid, 0) == 0 || errno != ESRCH) {
      continue;
    }
    for (const fs::directory_entry& group : fs::directory_iterator(owner.path(), ec)) {
      if (group.is_directory(ec)) MoveOutAndRemove(mount, group.path().string()).IgnoreError();
    }
    MoveOutAndRemove(mount, owner.path().string()).IgnoreError();
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<CpuQuotaGroups>> CpuQuotaGroups::Create(const std::string& mount) {
  std::error_code ec;
  if (!fs::exists(mount + "/cpu.cfs_quota_us", ec)) {
    return absl::FailedPreconditionError(
        absl::StrCat("no cgroup v1 cpu controller at ", mount, " (", mount,
                     "/cpu.cfs_quota_us missing): CPU quotas need it mounted there"));
  }
  const std::string scd = mount + "/scd";
  if (mkdir(scd.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create ", scd, ": ", std::strerror(errno), " (CPU quotas need root)"));
  }
  RemoveStale(mount, scd);
  const std::string root = absl::StrCat(scd, "/", getpid());
  if (mkdir(root.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create ", root, ": ", std::strerror(errno)));
  }
  return std::unique_ptr<CpuQuotaGroups>(new CpuQuotaGroups(mount, root));
}

CpuQuotaGroups::~CpuQuotaGroups() {
  absl::MutexLock lock(&mu_);
  for (const std::string& name : names_) MoveOutAndRemove(mount_, Path(name)).IgnoreError();
  MoveOutAndRemove(mount_, root_).IgnoreError();
  rmdir((mount_ + "/scd").c_str());  // when no other run holds groups there
}

std::string CpuQuotaGroups::Path(const std::string& name) const { return root_ + "/" + name; }

absl::Status CpuQuotaGroups::Place(pid_t pid, const std::string& name, double cpus,
                                   absl::Duration period) {
  if (!ValidName(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("CPU quota group name '", name, "': 1 to 64 of [A-Za-z0-9_.-], not . or .."));
  }
  const int64_t period_us = absl::ToInt64Microseconds(period);
  if (period_us < 1000 || period_us > 1000000) {
    return absl::InvalidArgumentError(
        absl::StrCat("CPU quota period ", absl::FormatDuration(period), ": 1 ms to 1 s"));
  }
  const double quota = cpus * static_cast<double>(period_us);
  if (!(quota >= 1000) || !(cpus <= 1024)) {
    return absl::InvalidArgumentError(
        absl::StrCat("CPU quota of ", cpus, " CPUs per ", absl::FormatDuration(period),
                     ": at least 1 ms of CPU time per period, at most 1024 CPUs"));
  }
  if (pid <= 0) return absl::InvalidArgumentError(absl::StrCat("no process ", pid));
  absl::MutexLock lock(&mu_);
  const std::string group = Path(name);
  if (mkdir(group.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::InternalError(absl::StrCat("cannot create ", group, ": ", std::strerror(errno)));
  }
  if (std::find(names_.begin(), names_.end(), name) == names_.end()) names_.push_back(name);
  // The quota off first: a new period below the old quota's value is then always accepted.
  SCD_RETURN_IF_ERROR(WriteControl(group + "/cpu.cfs_quota_us", "-1"));
  SCD_RETURN_IF_ERROR(WriteControl(group + "/cpu.cfs_period_us", absl::StrCat(period_us)));
  SCD_RETURN_IF_ERROR(
      WriteControl(group + "/cpu.cfs_quota_us", absl::StrCat(static_cast<int64_t>(quota))));
  return WriteControl(group + "/cgroup.procs", absl::StrCat(pid));
}

absl::StatusOr<CpuGroupStat> CpuQuotaGroups::Stat(const std::string& name) const {
  SCD_ASSIGN_OR_RETURN(std::string text, ReadFileToString(Path(name) + "/cpu.stat"));
  CpuGroupStat stat;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipWhitespace())) {
    std::vector<absl::string_view> kv = absl::StrSplit(line, ' ');
    int64_t value = 0;
    if (kv.size() != 2 || !absl::SimpleAtoi(kv[1], &value)) continue;
    if (kv[0] == "nr_periods") stat.periods = value;
    if (kv[0] == "nr_throttled") stat.throttled = value;
    if (kv[0] == "throttled_time") stat.throttled_time = absl::Nanoseconds(value);
  }
  return stat;
}

}  // namespace scd
