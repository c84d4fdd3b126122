#include "base/connection_gate.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/host_port.h"
#include "base/thread_name.h"

namespace scd {
namespace {

std::string Errno(int error) { return std::strerror(error); }

// A listening socket on one resolved address; -1 and `*error` set when it cannot.
int ListenOn(const sockaddr* address, socklen_t length, int family, bool dual_stack, int* error) {
  const int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *error = errno;
    return -1;
  }
  const int one = 1, zero = 0;
  // SO_REUSEADDR only (a restart may bind over TIME_WAIT); never SO_REUSEPORT.
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (family == AF_INET6) {
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, dual_stack ? &zero : &one, sizeof(int));
  }
  if (bind(fd, address, length) != 0 || listen(fd, 4096) != 0) {
    *error = errno;
    close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

uint64_t RaiseOpenFileLimit() {
  static std::once_flag once;
  std::call_once(once, [] {
    rlimit limit{};
    if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
      limit.rlim_cur = limit.rlim_max;
      setrlimit(RLIMIT_NOFILE, &limit);
    }
  });
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return 1024;
  return limit.rlim_cur == RLIM_INFINITY ? (uint64_t{1} << 20) : limit.rlim_cur;
}

absl::StatusOr<std::unique_ptr<ConnectionGate>> ConnectionGate::Listen(
    const std::string& listen, ConnectionGateOptions options) {
  absl::StatusOr<HostPort> where = ParseHostPort(listen);
  if (!where.ok()) return where.status();
  std::unique_ptr<ConnectionGate> gate(new ConnectionGate());
  gate->options_ = std::move(options);
  int error = 0;
  const std::string port = std::to_string(where->port);
  if (where->wildcard()) {
    // Every interface: dual-stack IPv6 when the host has IPv6 (as gRPC does), else IPv4.
    sockaddr_in6 any6{};
    any6.sin6_family = AF_INET6;
    any6.sin6_addr = in6addr_any;
    any6.sin6_port = htons(where->port);
    const bool v4_only = where->host == "0.0.0.0";
    if (!v4_only) {
      gate->listen_fd_ = ListenOn(reinterpret_cast<sockaddr*>(&any6), sizeof(any6), AF_INET6,
                                  /*dual_stack=*/true, &error);
    }
    if (gate->listen_fd_ < 0 && (v4_only || error == EAFNOSUPPORT)) {
      sockaddr_in any4{};
      any4.sin_family = AF_INET;
      any4.sin_addr.s_addr = htonl(INADDR_ANY);
      any4.sin_port = htons(where->port);
      gate->listen_fd_ =
          ListenOn(reinterpret_cast<sockaddr*>(&any4), sizeof(any4), AF_INET, false, &error);
    }
  } else {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    addrinfo* found = nullptr;
    const int resolved = getaddrinfo(where->host.c_str(), port.c_str(), &hints, &found);
    if (resolved != 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot listen on ", listen, ": ", gai_strerror(resolved)));
    }
    // IPv4 first: "localhost" then serves the clients that try 127.0.0.1 and those that fall back
    // to it after ::1.
    for (int family : {AF_INET, AF_INET6}) {
      for (addrinfo* a = found; a != nullptr && gate->listen_fd_ < 0; a = a->ai_next) {
        if (a->ai_family != family) continue;
        gate->listen_fd_ = ListenOn(a->ai_addr, a->ai_addrlen, a->ai_family, false, &error);
      }
    }
    freeaddrinfo(found);
  }
  if (gate->listen_fd_ < 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", listen, ": ", Errno(error),
        error == EADDRINUSE ? " (another process serves this port; pick another --listen)" : ""));
  }
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  getsockname(gate->listen_fd_, reinterpret_cast<sockaddr*>(&bound), &length);
  gate->port_ =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  gate->address_ = HostPort{where->host, static_cast<uint16_t>(gate->port_)}.ToString();
  gate->wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (gate->wake_fd_ < 0) return absl::InternalError(absl::StrCat("eventfd: ", Errno(errno)));
  return gate;
}

ConnectionGate::~ConnectionGate() {
  Stop();
  if (listen_fd_ >= 0) close(listen_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

void ConnectionGate::Start(std::function<void(int fd)> hand_over) {
  hand_over_ = std::move(hand_over);
  thread_ = std::thread([this] {
    NameThisThread("scd-conn-gate");
    Loop();
  });
}

void ConnectionGate::Stop() {
  if (stopping_.exchange(true)) {
    if (thread_.joinable()) thread_.join();
    return;
  }
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = write(wake_fd_, &one, sizeof(one));
  }
  if (thread_.joinable()) thread_.join();
  // Closed now, not with the gate: a stopped server's port refuses at once. Left open, the kernel
  // would still complete new connections into the backlog that nobody accepts, and a client
  // (a coordinator's channel reconnecting to a node that was shut down) would wait on a silent
  // connection until its keepalive or deadline instead of failing UNAVAILABLE at once.
  if (listen_fd_ >= 0) close(listen_fd_);
  listen_fd_ = -1;
}

ConnectionGateCounters ConnectionGate::counters() const {
  return {handed_.load(), timed_out_.load(), evicted_.load(), refused_.load(),
          accept_errors_.load()};
}

// Connections waiting for their preface: by descriptor, and in arrival order for eviction. An
// entry of `order` is stale once its descriptor was handed over or dropped (the number may have
// been reused by a newer connection: the sequence number tells them apart).
struct ConnectionGate::LoopState {
  struct Waiting {
    absl::Time deadline;
    uint64_t seq;
  };
  int epoll = -1;
  uint64_t ceiling = 16;  // descriptors at or above it are refused
  // A spare descriptor: when accept() fails with EMFILE, closing it frees one to accept (and
  // close) the waiting connection, so the backlog drains instead of spinning.
  int spare = -1;
  std::map<int, Waiting> pending;
  std::deque<std::pair<int, uint64_t>> order;
  uint64_t next_seq = 0;
  absl::Time last_accept_error = absl::InfinitePast();

  bool Live(const std::pair<int, uint64_t>& entry) const {
    auto it = pending.find(entry.first);
    return it != pending.end() && it->second.seq == entry.second;
  }
};

void ConnectionGate::Drop(LoopState& s, int fd) {
  epoll_ctl(s.epoll, EPOLL_CTL_DEL, fd, nullptr);
  s.pending.erase(fd);
  close(fd);
}

void ConnectionGate::Hand(LoopState& s, int fd) {
  epoll_ctl(s.epoll, EPOLL_CTL_DEL, fd, nullptr);
  s.pending.erase(fd);
  ++handed_;
  hand_over_(fd);
}

void ConnectionGate::Check(LoopState& s, int fd) {
  const std::string& preface = options_.preface;
  char buffer[64];
  const size_t want = std::min(preface.size(), sizeof(buffer));
  const ssize_t n = recv(fd, buffer, want, MSG_PEEK);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  if (n <= 0 || std::memcmp(buffer, preface.data(), static_cast<size_t>(n)) != 0) {
    ++refused_;
    Drop(s, fd);
    return;
  }
  if (static_cast<size_t>(n) == want) Hand(s, fd);
}

int ConnectionGate::ExpireWaiting(LoopState& s) {
  // The oldest first (arrival order = deadline order).
  const absl::Time now = absl::Now();
  while (!s.order.empty()) {
    if (!s.Live(s.order.front())) {
      s.order.pop_front();
      continue;
    }
    const int fd = s.order.front().first;
    if (s.pending[fd].deadline > now) break;
    ++timed_out_;
    Drop(s, fd);
    s.order.pop_front();
  }
  if (s.order.empty()) return 1000;
  return static_cast<int>(std::clamp<int64_t>(
      absl::ToInt64Milliseconds(s.pending[s.order.front().first].deadline - now) + 1, 1, 1000));
}

bool ConnectionGate::AcceptOne(LoopState& s) {
  const int conn = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (conn < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
    if (errno == EINTR || errno == ECONNABORTED) return true;
    ++accept_errors_;
    if (absl::Now() - s.last_accept_error > absl::Seconds(1)) {
      s.last_accept_error = absl::Now();
      // No logger in base/: the counters say it; stderr for the operator.
      std::fprintf(stderr, "connection gate %s: accept: %s (kept accepting)\n", address_.c_str(),
                   Errno(errno).c_str());
    }
    if ((errno == EMFILE || errno == ENFILE) && s.spare >= 0) {
      close(s.spare);
      const int shed = accept(listen_fd_, nullptr, nullptr);
      if (shed >= 0) close(shed);
      s.spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    return false;
  }
  // accept() returns the lowest free descriptor: `conn` at the ceiling means that many are open,
  // so this one is refused before the process can run out.
  if (static_cast<uint64_t>(conn) >= s.ceiling) {
    ++refused_;
    close(conn);
    return true;
  }
  const int one = 1;
  setsockopt(conn, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (options_.preface.empty()) {
    ++handed_;
    hand_over_(conn);
    return true;
  }
  while (s.pending.size() >= options_.max_pending && !s.order.empty()) {
    const std::pair<int, uint64_t> oldest = s.order.front();
    s.order.pop_front();
    if (s.Live(oldest)) {
      ++evicted_;
      Drop(s, oldest.first);
    }
  }
  s.pending[conn] = LoopState::Waiting{absl::Now() + options_.handshake_timeout, s.next_seq};
  s.order.emplace_back(conn, s.next_seq++);
  epoll_event watch{};
  watch.events = EPOLLIN | EPOLLRDHUP | EPOLLET;
  watch.data.fd = conn;
  epoll_ctl(s.epoll, EPOLL_CTL_ADD, conn, &watch);
  Check(s, conn);  // its preface may already be there
  return true;
}

void ConnectionGate::AcceptAll(LoopState& s) {
  for (int accepted = 0; accepted < 256 && AcceptOne(s); ++accepted) {
  }
}

void ConnectionGate::Loop() {
  LoopState s;
  s.epoll = epoll_create1(EPOLL_CLOEXEC);
  if (s.epoll < 0) return;
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.fd = listen_fd_;
  epoll_ctl(s.epoll, EPOLL_CTL_ADD, listen_fd_, &event);
  event.data.fd = wake_fd_;
  epoll_ctl(s.epoll, EPOLL_CTL_ADD, wake_fd_, &event);
  const uint64_t limit = RaiseOpenFileLimit();
  s.ceiling = limit > options_.fd_headroom + 16 ? limit - options_.fd_headroom : 16;
  s.spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
  epoll_event events[64];
  while (!stopping_.load()) {
    const int ready = epoll_wait(s.epoll, events, 64, ExpireWaiting(s));
    for (int i = 0; i < ready; ++i) {
      const int fd = events[i].data.fd;
      if (fd == wake_fd_) continue;
      if (fd == listen_fd_) {
        AcceptAll(s);
      } else if (s.pending.count(fd)) {
        Check(s, fd);
      }
    }
  }
  for (const auto& [fd, waiting] : s.pending) close(fd);
  if (s.spare >= 0) close(s.spare);
  close(s.epoll);
}

}  // namespace scd
