// A daemon (or any long-running binary of the build) as a child process of a test: stderr to
// DIR/NAME.log, its serving address read from DIR/NAME.addr (--address-file) and its control
// plane's from DIR/NAME.control.addr (--control-address-file), the test cluster secret in its
// environment ($SCD_CLUSTER_SECRET = kTestClusterSecret unless `env` sets it), killed on
// destruction. Torch-free.
// Thread-safety: use from the test's thread.
#ifndef SCD_TESTS_TEST_DAEMON_H_
#define SCD_TESTS_TEST_DAEMON_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "base/child_process.h"

namespace scd::testing {

// The cluster secret test daemons share (what clients of their control planes attach).
inline constexpr char kTestClusterSecret[] = "test-cluster-secret-0123456789abcdef";

class Daemon {
 public:
  // Starts argv[0] with argv[1..], `--address-file DIR/NAME.addr` and `--control-address-file
  // DIR/NAME.control.addr`. `env`: "NAME=VALUE" entries set in the child ("NAME=" unsets).
  Daemon(const std::string& dir, const std::string& name, std::vector<std::string> argv,
         std::vector<std::string> env = {});
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // The address once it serves ("" after `timeout`, with a test failure showing the log).
  std::string Address(absl::Duration timeout = absl::Seconds(30));
  // The control plane's address once it serves.
  std::string ControlAddress(absl::Duration timeout = absl::Seconds(30));
  // The HTTP listener's (argv with --http-listen gets --http-address-file DIR/NAME.http.addr).
  std::string HttpAddress(absl::Duration timeout = absl::Seconds(30));
  void Kill(int signal);
  // Waits for it to exit (after Kill): its exit status (-1: killed by a signal, or still running
  // after `timeout`, then SIGKILLed).
  int Wait(absl::Duration timeout);
  // Exit status after SIGTERM (-1: killed by a signal or still running after `timeout`).
  int Terminate(absl::Duration timeout);
  // How it ended and its log, for a failed expectation on Terminate: `<< daemon.Ending()`.
  std::string Ending() const;
  const std::string& log() const { return log_; }
  pid_t pid() const { return child_.pid(); }

 private:
  std::string ReadAddress(const std::string& file, absl::Duration timeout);
  std::string log_, address_file_, control_address_file_, http_address_file_;
  ChildProcess child_;
};

// BuildDir()/bin/NAME.
std::string Bin(const std::string& name);

}  // namespace scd::testing

#endif  // SCD_TESTS_TEST_DAEMON_H_
