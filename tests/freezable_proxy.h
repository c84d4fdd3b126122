// FreezableProxy: forwards one TCP connection to a local port until frozen; then it keeps both
// sockets open and silent, like a peer whose host stopped answering (no FIN, no RST) -- a process
// under SIGSTOP or a link that drops everything, for tests that run in one process. Connections
// after the first wait in its listen backlog, unanswered, as they would on a stopped host.
// Thread-safety: Freeze may be called from any thread; the rest from the owner's.
#ifndef SCD_TESTS_FREEZABLE_PROXY_H_
#define SCD_TESTS_FREEZABLE_PROXY_H_

#include <atomic>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"

namespace scd::testing {

class FreezableProxy {
 public:
  // Listens on a free loopback port; the first connection there is forwarded to `target_port`.
  explicit FreezableProxy(int target_port);
  ~FreezableProxy();
  FreezableProxy(const FreezableProxy&) = delete;
  FreezableProxy& operator=(const FreezableProxy&) = delete;

  std::string address() const;  // 127.0.0.1:PORT
  void Freeze() { frozen_ = true; }

 private:
  void Run();

  const int target_port_;
  int listen_fd_ = -1;
  int client_fd_ = -1;
  int server_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> frozen_{false};
  std::atomic<bool> stop_{false};
  absl::Notification stopped_;
  std::thread thread_;
};

}  // namespace scd::testing

#endif  // SCD_TESTS_FREEZABLE_PROXY_H_
