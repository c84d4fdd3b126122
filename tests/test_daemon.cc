#include "tests/test_daemon.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "absl/time/clock.h"
#include "tests/test_files.h"

namespace scd::testing {

Daemon::Daemon(const std::string& dir, const std::string& name, std::vector<std::string> argv,
               std::vector<std::string> env)
    : log_(dir + "/" + name + ".log"),
      address_file_(dir + "/" + name + ".addr"),
      control_address_file_(dir + "/" + name + ".control.addr") {
  argv.push_back("--address-file");
  argv.push_back(address_file_);
  argv.push_back("--control-address-file");
  argv.push_back(control_address_file_);
  std::remove(address_file_.c_str());  // a failed earlier test keeps its directory
  std::remove(control_address_file_.c_str());
  pid_ = fork();
  if (pid_ == 0) {
    setenv("SCD_CLUSTER_SECRET", kTestClusterSecret, 1);
    for (const std::string& entry : env) {
      const size_t eq = entry.find('=');
      if (eq == entry.size() - 1) {
        unsetenv(entry.substr(0, eq).c_str());
      } else {
        setenv(entry.substr(0, eq).c_str(), entry.substr(eq + 1).c_str(), 1);
      }
    }
    const int fd = open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 2);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
}

Daemon::~Daemon() {
  if (pid_ > 0 && !reaped_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

std::string Daemon::Address(absl::Duration timeout) { return ReadAddress(address_file_, timeout); }

std::string Daemon::ControlAddress(absl::Duration timeout) {
  return ReadAddress(control_address_file_, timeout);
}

std::string Daemon::ReadAddress(const std::string& file, absl::Duration timeout) {
  const absl::Time limit = absl::Now() + timeout;
  while (absl::Now() < limit) {
    std::ifstream in(file);
    std::string address;
    if (in >> address) return address;
    absl::SleepFor(absl::Milliseconds(20));
  }
  ADD_FAILURE() << "no address from " << log_ << ":\n" << ReadFile(log_);
  return "";
}

void Daemon::Kill(int signal) { kill(pid_, signal); }

int Daemon::Terminate(absl::Duration timeout) {
  kill(pid_, SIGTERM);
  const absl::Time limit = absl::Now() + timeout;
  int status = 0;
  while (absl::Now() < limit) {
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      reaped_ = true;
      return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return -1;
}

std::string Bin(const std::string& name) { return BuildDir() + "/bin/" + name; }

}  // namespace scd::testing
