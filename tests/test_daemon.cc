#include "tests/test_daemon.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "absl/time/clock.h"
#include "tests/test_files.h"

namespace scd::testing {

Daemon::Daemon(const std::string& dir, const std::string& name, std::vector<std::string> argv,
               std::vector<std::string> env)
    : log_(dir + "/" + name + ".log"),
      address_file_(dir + "/" + name + ".addr"),
      control_address_file_(dir + "/" + name + ".control.addr"),
      http_address_file_(dir + "/" + name + ".http.addr") {
  std::remove(http_address_file_.c_str());
  if (std::find(argv.begin(), argv.end(), "--http-listen") != argv.end()) {
    argv.push_back("--http-address-file");
    argv.push_back(http_address_file_);
  }
  argv.push_back("--address-file");
  argv.push_back(address_file_);
  argv.push_back("--control-address-file");
  argv.push_back(control_address_file_);
  std::remove(address_file_.c_str());  // a failed earlier test keeps its directory
  std::remove(control_address_file_.c_str());
  env.insert(env.begin(), std::string("SCD_CLUSTER_SECRET=") + kTestClusterSecret);
  absl::StatusOr<ChildProcess> child = ChildProcess::Start(std::move(argv), log_, env);
  if (!child.ok()) {
    ADD_FAILURE() << child.status();
    return;
  }
  child_ = *std::move(child);
}

Daemon::~Daemon() = default;  // the child is killed and reaped unless it ended

std::string Daemon::Address(absl::Duration timeout) { return ReadAddress(address_file_, timeout); }

std::string Daemon::ControlAddress(absl::Duration timeout) {
  return ReadAddress(control_address_file_, timeout);
}

std::string Daemon::HttpAddress(absl::Duration timeout) {
  return ReadAddress(http_address_file_, timeout);
}

std::string Daemon::ReadAddress(const std::string& file, absl::Duration timeout) {
  absl::StatusOr<std::string> address = child_.WaitForFile(file, timeout);
  if (address.ok()) return *address;
  ADD_FAILURE() << "no address from " << log_ << ": " << address.status().message();
  return "";
}

void Daemon::Kill(int signal) { child_.Signal(signal); }

int Daemon::Wait(absl::Duration timeout) { return child_.Wait(timeout); }

int Daemon::Terminate(absl::Duration timeout) { return child_.Terminate(timeout); }

std::string Daemon::Ending() const {
  return child_.HowItEnded() + "; " + log_ + " ends:\n" + child_.LogTail();
}

std::string Bin(const std::string& name) { return BuildDir() + "/bin/" + name; }

}  // namespace scd::testing
