// ChildProcess: a long-running program of ours (a daemon, a server a harness starts) as a child:
// argv run directly (no shell), stderr to a log file, optional environment changes, killed
// (SIGKILL) and reaped on destruction unless it already ended, and sent SIGTERM by the kernel
// when the thread that started it dies (PR_SET_PDEATHSIG: start children from the main thread).
// WaitForFile reads a line the child writes when ready (an --address-file). Used by the tests'
// daemons and by scd-bench. Every timeout runs on the monotonic clock (a step of the wall clock
// changes none). Thread-safety: use from one thread.
#ifndef SCD_BASE_CHILD_PROCESS_H_
#define SCD_BASE_CHILD_PROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace scd {

class ChildProcess {
 public:
  // Starts argv[0] (a path; not searched on PATH unless it has no '/') with argv[1..]; its
  // stderr (and stdout when `stdout_to_log`) goes to `log`. `env`: "NAME=VALUE" entries set in
  // the child, "NAME=" unsets. Only descriptors 0-2 reach the child (whatever else this process
  // has open, O_CLOEXEC or not, is closed in it). INTERNAL when fork fails; a program that cannot
  // be run exits 127.
  static absl::StatusOr<ChildProcess> Start(std::vector<std::string> argv, const std::string& log,
                                            const std::vector<std::string>& env = {},
                                            bool stdout_to_log = false);
  // Runs argv to its end (stdout and stderr to a temporary log, removed after): the exit status
  // (-1: killed by a signal or at the timeout), how it ended in words (HowItEnded) and the
  // output's tail. INTERNAL when it cannot be started.
  struct Outcome {
    int status = -1;
    std::string ending;
    std::string output;
  };
  static absl::StatusOr<Outcome> Run(std::vector<std::string> argv,
                                     absl::Duration timeout = absl::Minutes(5));
  ChildProcess() = default;
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess();

  // The first whitespace-delimited word of `file` once the child wrote it (woken by the kernel:
  // inotify on the file's folder, a pidfd for the child's exit). DEADLINE_EXCEEDED
  // after `timeout`, FAILED_PRECONDITION when the child exited first (both quote the log's tail).
  absl::StatusOr<std::string> WaitForFile(const std::string& file, absl::Duration timeout);
  void Signal(int signal);
  // SIGTERM, then waits up to `timeout`: the exit status (-1: killed by a signal, or still
  // running at the timeout, then SIGKILLed).
  int Terminate(absl::Duration timeout);
  // Waits for the child to exit: its exit status (-1: killed by a signal; after `timeout` it is
  // SIGKILLed and -1 returned).
  int Wait(absl::Duration timeout);
  bool running();
  // For failure messages: "exited with status N", "killed by signal N (Terminated)", "still
  // running after the timeout (SIGKILLed)", or "running" (not yet seen to end).
  std::string HowItEnded() const;
  pid_t pid() const { return pid_; }
  const std::string& log() const { return log_; }
  // The last `bytes` of the log, for error messages.
  std::string LogTail(size_t bytes = 2000) const;

 private:
  // Waits until the child exits (reaped: true) or `timeout` passes (false): woken by the kernel
  // through a pidfd (Linux >= 5.3), else by looking every 5 ms.
  bool ReapWithin(absl::Duration timeout);
  // SIGKILL and reap (what a timeout ends in).
  void Kill();

  pid_t pid_ = -1;
  bool reaped_ = false;
  bool killed_after_timeout_ = false;
  int status_ = 0;
  std::string log_;
};

}  // namespace scd

#endif  // SCD_BASE_CHILD_PROCESS_H_
