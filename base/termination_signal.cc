#include "base/termination_signal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

namespace scd {
namespace {

// The pipe the handler writes to: [0] read by the waiter, [1] written by the handler.
int signal_pipe[2] = {-1, -1};

void OnTerminationSignal(int signal) {
  const int saved = errno;  // the interrupted code may be reading errno
  const char byte = static_cast<char>(signal);
  // Non-blocking: a full pipe (hundreds of signals never waited for) drops the extra ones.
  [[maybe_unused]] const ssize_t written = write(signal_pipe[1], &byte, 1);
  errno = saved;
}

sigset_t TerminationSet() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

}  // namespace

void CatchTerminationSignals() {
  const sigset_t set = TerminationSet();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  if (signal_pipe[0] >= 0) return;                 // caught already
  if (pipe2(signal_pipe, O_CLOEXEC) != 0) return;  // no handler: WaitForTerminationSignal sigwaits
  fcntl(signal_pipe[1], F_SETFL, O_NONBLOCK);
  struct sigaction action = {};
  action.sa_handler = OnTerminationSignal;
  action.sa_flags = SA_RESTART;
  sigfillset(&action.sa_mask);  // one handler at a time
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
}

std::string WaitForTerminationSignal() {
  const sigset_t set = TerminationSet();
  int signal = 0;
  if (signal_pipe[0] < 0) {  // no pipe, no handler: take them synchronously (blocked everywhere)
    while (sigwait(&set, &signal) != 0) {
    }
  } else {
    // A signal pending while every thread blocked it is delivered here, on the unblock.
    pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
    char byte = 0;
    ssize_t got = 0;
    while ((got = read(signal_pipe[0], &byte, 1)) != 1) {
      if (got < 0 && errno != EINTR) break;
    }
    signal = byte;
  }
  return signal == SIGINT ? "SIGINT" : "SIGTERM";
}

}  // namespace scd
