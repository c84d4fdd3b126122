#include "tests/freezable_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <vector>

#include "absl/strings/str_cat.h"

namespace scd::testing {
namespace {

sockaddr_in Loopback(int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  return addr;
}

}  // namespace

FreezableProxy::FreezableProxy(int target_port) : target_port_(target_port) {
  listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = Loopback(0);
  bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  listen(listen_fd_, 4);
  socklen_t len = sizeof(addr);
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  thread_ = std::thread([this] { Run(); });
}

FreezableProxy::~FreezableProxy() {
  stop_ = true;
  stopped_.Notify();
  thread_.join();
  for (int fd : {listen_fd_, client_fd_, server_fd_}) {
    if (fd >= 0) close(fd);
  }
}

std::string FreezableProxy::address() const { return absl::StrCat("127.0.0.1:", port_); }

void FreezableProxy::Run() {
  // A 20 ms poll, so that the destructor's stop is seen (the sockets have no event for it).
  pollfd accept_poll{listen_fd_, POLLIN, 0};
  while (!stop_ && poll(&accept_poll, 1, 20) <= 0) {
  }
  if (stop_) return;
  client_fd_ = accept(listen_fd_, nullptr, nullptr);
  server_fd_ = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in target = Loopback(target_port_);
  if (connect(server_fd_, reinterpret_cast<sockaddr*>(&target), sizeof(target)) != 0) return;
  std::vector<char> buffer(1 << 16);
  while (!stop_) {
    if (frozen_) {  // silent from now on: both sockets open until the proxy goes
      stopped_.WaitForNotification();
      return;
    }
    pollfd fds[2] = {{client_fd_, POLLIN, 0}, {server_fd_, POLLIN, 0}};
    if (poll(fds, 2, 20) <= 0) continue;
    for (int i = 0; i < 2; ++i) {
      if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      const ssize_t n = read(fds[i].fd, buffer.data(), buffer.size());
      if (n <= 0) return;
      const int to = i == 0 ? server_fd_ : client_fd_;
      for (ssize_t done = 0; done < n;) {
        const ssize_t w = write(to, buffer.data() + done, static_cast<size_t>(n - done));
        if (w <= 0) return;
        done += w;
      }
    }
  }
}

}  // namespace scd::testing
