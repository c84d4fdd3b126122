#include "base/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/timer.h"

namespace scd {

absl::StatusOr<ChildProcess> ChildProcess::Start(std::vector<std::string> argv,
                                                 const std::string& log,
                                                 const std::vector<std::string>& env,
                                                 bool stdout_to_log) {
  if (argv.empty()) return absl::InvalidArgumentError("ChildProcess: empty argv");
  // Everything the child needs is prepared before fork (no allocation after it).
  std::vector<char*> args;
  for (std::string& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  // The child's environment: ours with `env` applied ("NAME=" removes NAME).
  std::vector<std::string> environment;
  for (char** e = environ; *e != nullptr; ++e) environment.emplace_back(*e);
  for (const std::string& entry : env) {
    const size_t eq = entry.find('=');
    if (eq == std::string::npos) continue;
    const std::string prefix = entry.substr(0, eq + 1);
    std::vector<std::string> kept;
    for (std::string& e : environment) {
      if (e.compare(0, prefix.size(), prefix) != 0) kept.push_back(std::move(e));
    }
    environment = std::move(kept);
    if (eq != entry.size() - 1) environment.push_back(entry);
  }
  std::vector<char*> envp;
  for (std::string& e : environment) envp.push_back(e.data());
  envp.push_back(nullptr);
  // The highest descriptor the child may have inherited (close_range's fallback).
  const long open_max = sysconf(_SC_OPEN_MAX);
  const int last_fd = open_max > 0 && open_max < (1 << 20) ? static_cast<int>(open_max) - 1 : 4095;
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    // The child goes when this process does (killed too): no daemon outlives its harness.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
      dup2(fd, 2);
      if (stdout_to_log) dup2(fd, 1);
    }
    // Only stdin, stdout and stderr go across exec: a descriptor another thread of ours opened
    // without O_CLOEXEC (an ifstream on /proc, a socket) would otherwise live in the child for
    // good and pin what it names (a harness found one on a coordinator it had started).
    if (close_range(3, ~0U, 0) != 0) {
      for (int i = 3; i <= last_fd; ++i) close(i);  // kernels before 5.9
    }
    execvpe(args[0], args.data(), envp.data());  // a name without '/' is searched on PATH
    _exit(127);
  }
  ChildProcess child;
  child.pid_ = pid;
  child.log_ = log;
  return child;
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept { *this = std::move(other); }

ChildProcess& ChildProcess::operator=(ChildProcess&& other) noexcept {
  if (this != &other) {
    if (pid_ > 0 && !reaped_) {  // the child this one held
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    pid_ = std::exchange(other.pid_, -1);
    reaped_ = std::exchange(other.reaped_, false);
    status_ = other.status_;
    killed_after_timeout_ = other.killed_after_timeout_;
    log_ = std::move(other.log_);
  }
  return *this;
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0 && !reaped_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    reaped_ = true;
  }
}

bool ChildProcess::running() {
  if (pid_ <= 0 || reaped_) return false;
  if (waitpid(pid_, &status_, WNOHANG) == pid_) reaped_ = true;
  return !reaped_;
}

std::string ChildProcess::HowItEnded() const {
  if (pid_ <= 0) return "not started";
  if (!reaped_) return "running";
  if (killed_after_timeout_) return "still running after the timeout (SIGKILLed)";
  if (WIFEXITED(status_)) return absl::StrCat("exited with status ", WEXITSTATUS(status_));
  if (WIFSIGNALED(status_)) {
    return absl::StrCat("killed by signal ", WTERMSIG(status_), " (", strsignal(WTERMSIG(status_)),
                        ")");
  }
  return "ended";
}

std::string ChildProcess::LogTail(size_t bytes) const {
  std::ifstream in(log_);
  std::stringstream text;
  text << in.rdbuf();
  const std::string all = text.str();
  return all.size() > bytes ? all.substr(all.size() - bytes) : all;
}

namespace {

// A pidfd for `pid` (readable once it exits), or -1 where the kernel has none (Linux < 5.3).
int OpenPidfd(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
#else
  (void)pid;
  return -1;
#endif
}

// An inotify descriptor watching the folder of `file` for writes and files landing there, or -1.
int WatchFolderOf(const std::string& file) {
  const int watch = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  if (watch < 0) return -1;
  const size_t slash = file.rfind('/');
  const std::string folder = slash == std::string::npos ? "." : file.substr(0, slash + 1);
  if (inotify_add_watch(watch, folder.c_str(),
                        IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE) < 0) {
    close(watch);
    return -1;
  }
  return watch;
}

}  // namespace

absl::StatusOr<std::string> ChildProcess::WaitForFile(const std::string& file,
                                                      absl::Duration timeout) {
  // Timed on the monotonic clock, as every wait here: a step of the wall clock (NTP, a virtual
  // machine resumed) must neither end a wait at once nor stretch it.
  const Stopwatch waited;
  // Woken by the kernel: a write or a file landing in the folder (inotify), the child's exit
  // (pidfd); without either (an old kernel, a folder that cannot be watched) it looks every 20 ms.
  const int watch = WatchFolderOf(file);
  const int pidfd = OpenPidfd(pid_);
  const absl::Cleanup close_both = [watch, pidfd] {
    if (watch >= 0) close(watch);
    if (pidfd >= 0) close(pidfd);
  };
  for (;;) {
    std::ifstream in(file);
    std::string word;
    if (in >> word) return word;
    if (!running()) {
      return absl::FailedPreconditionError(absl::StrCat("the child process ended before writing ",
                                                        file, "; its log (", log_, ") ends:\n",
                                                        LogTail()));
    }
    const absl::Duration left = timeout - absl::Seconds(waited.Seconds());
    if (left < absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat("nothing in ", file, " after ",
                                                      absl::FormatDuration(timeout), "; log (",
                                                      log_, ") ends:\n", LogTail()));
    }
    const bool woken = watch >= 0 && pidfd >= 0;
    pollfd fds[2] = {{watch, POLLIN, 0}, {pidfd, POLLIN, 0}};
    poll(fds, woken ? 2 : 0,
         static_cast<int>(std::min(left, woken ? absl::Seconds(1) : absl::Milliseconds(20)) /
                          absl::Milliseconds(1)) +
             1);
    char events[4096];
    while (watch >= 0 && read(watch, events, sizeof(events)) > 0) {
    }
  }
}

bool ChildProcess::ReapWithin(absl::Duration timeout) {
  if (!running()) return true;
  const Stopwatch waited;
  const int pidfd = OpenPidfd(pid_);
  while (running()) {
    const absl::Duration left = timeout - absl::Seconds(waited.Seconds());
    if (left <= absl::ZeroDuration()) break;
    if (pidfd < 0) {  // no pidfd (an old kernel): look again shortly
      absl::SleepFor(std::min(left, absl::Milliseconds(5)));
      continue;
    }
    pollfd exited{pidfd, POLLIN, 0};
    // Readable once the child exits; EINTR and a bound of 1 s per call just loop.
    poll(&exited, 1,
         static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1000)));
  }
  if (pidfd >= 0) close(pidfd);
  return reaped_;
}

void ChildProcess::Kill() {
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  reaped_ = true;
  killed_after_timeout_ = true;
}

int ChildProcess::Wait(absl::Duration timeout) {
  if (pid_ <= 0) return -1;
  if (!ReapWithin(timeout)) {
    Kill();
    return -1;
  }
  return WIFEXITED(status_) ? WEXITSTATUS(status_) : -1;
}

absl::StatusOr<ChildProcess::Outcome> ChildProcess::Run(std::vector<std::string> argv,
                                                        absl::Duration timeout) {
  static std::atomic<int> counter{0};
  const std::string log = absl::StrCat("/tmp/scd-run-", getpid(), "-", counter++, ".log");
  absl::StatusOr<ChildProcess> child = Start(std::move(argv), log, {}, /*stdout_to_log=*/true);
  if (!child.ok()) return child.status();
  Outcome outcome;
  outcome.status = child->Wait(timeout);
  outcome.ending = child->HowItEnded();
  outcome.output = child->LogTail();
  std::remove(log.c_str());
  return outcome;
}

void ChildProcess::Signal(int signal) {
  if (pid_ > 0 && !reaped_) kill(pid_, signal);
}

int ChildProcess::Terminate(absl::Duration timeout) {
  if (pid_ <= 0) return -1;
  if (!reaped_) {
    kill(pid_, SIGTERM);
    if (!ReapWithin(timeout)) {
      Kill();
      return -1;
    }
  }
  return WIFEXITED(status_) ? WEXITSTATUS(status_) : -1;
}

}  // namespace scd
