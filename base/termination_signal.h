// SIGTERM and SIGINT for a daemon's graceful drain, taken on the main thread whichever thread the
// kernel hands them to. Threads a library started before main (OpenBLAS's pthread server starts
// its workers from a load-time constructor) keep the default signal mask, so a process-directed
// SIGTERM that arrives while the main thread is not waiting -- loading a model, writing its
// address files -- goes to such a thread; with the default action that kills the process
// instead of draining it. A handler (async-signal-safe: it writes the signal's number to a
// pipe) makes every delivery count, on any thread, at any time after CatchTerminationSignals.
// Thread-safety: CatchTerminationSignals once, first in main, before the process starts threads
// of its own; WaitForTerminationSignal from one thread.
#ifndef SCD_BASE_TERMINATION_SIGNAL_H_
#define SCD_BASE_TERMINATION_SIGNAL_H_

#include <string>

namespace scd {

// Installs the handler for SIGTERM and SIGINT (SA_RESTART) and blocks both in the calling
// thread, so every thread started after it inherits the block and is not interrupted by them.
// A signal that arrives before WaitForTerminationSignal is kept (in the pipe, or pending while
// every thread blocks it) and ends the next wait at once.
void CatchTerminationSignals();
// Waits for SIGTERM or SIGINT (one caught since CatchTerminationSignals, or one to come);
// returns its name ("SIGTERM" or "SIGINT"). Unblocks both in the calling thread.
std::string WaitForTerminationSignal();

}  // namespace scd

#endif  // SCD_BASE_TERMINATION_SIGNAL_H_
