// ConnectionGate: a TCP listener that a client cannot lock out, in front of a server that takes
// connected sockets (gRPC: grpc::AddInsecureChannelFromFd).
//
// gRPC 1.51's own listener stops accepting for good after one accept4() EMFILE ("Too many open
// files"), and any client can provoke it by opening connections that never finish the HTTP/2
// preface; it also listens with SO_REUSEPORT, so a second server on a used port starts silently
// and takes half the new connections. This gate owns the listening socket instead:
//  - it binds without SO_REUSEPORT: a port in use is an error (UNAVAILABLE, "address already in
//    use") before anything serves;
//  - a new connection is handed to the server only once its first bytes are the expected preface
//    (peeked, not consumed; for gRPC the 24-byte HTTP/2 client preface) within the handshake
//    timeout; otherwise it is closed;
//  - at most `max_pending` connections wait for their preface; one more evicts the oldest, so a
//    flood of half-open connections delays a real client by at most its own round trip;
//  - a connection whose descriptor would reach the process's descriptor ceiling (soft RLIMIT_NOFILE
//    minus `fd_headroom`) is closed at once: the process never runs out of descriptors because of
//    connections, so accept() cannot fail with EMFILE; if something else exhausts them, the gate
//    drains its backlog with a spare descriptor and keeps accepting (it never stops by itself).
// RaiseOpenFileLimit() at start lifts the soft limit to the hard one.
//
// Thread-safety: one accept thread per gate between Start and Stop; counters are atomic.
#ifndef SCD_BASE_CONNECTION_GATE_H_
#define SCD_BASE_CONNECTION_GATE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace scd {

// The HTTP/2 client preface every gRPC connection starts with (RFC 9113 §3.4).
inline constexpr char kHttp2ClientPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

struct ConnectionGateOptions {
  std::string preface;  // bytes every accepted connection must start with ("" = hand over at once)
  absl::Duration handshake_timeout = absl::Seconds(5);
  size_t max_pending = 256;  // connections waiting for their preface (oldest evicted beyond)
  size_t fd_headroom = 128;  // descriptors kept free for everything else the process opens
};

struct ConnectionGateCounters {
  uint64_t handed = 0;         // connections given to the server
  uint64_t timed_out = 0;      // closed: no preface within the handshake timeout
  uint64_t evicted = 0;        // closed: the oldest waiting when max_pending was reached
  uint64_t refused = 0;        // closed: descriptor ceiling reached, or not the preface
  uint64_t accept_errors = 0;  // accept() failures (EMFILE, ENFILE, ENOBUFS, ...)
};

class ConnectionGate {
 public:
  // Binds and listens on `listen` ("HOST:PORT", port 0: any free; an empty or wildcard host: every
  // interface, IPv4 and IPv6). UNAVAILABLE naming the address (and "address already in use") when
  // it cannot; INVALID_ARGUMENT for a malformed address.
  static absl::StatusOr<std::unique_ptr<ConnectionGate>> Listen(const std::string& listen,
                                                                ConnectionGateOptions options);
  ~ConnectionGate();  // Stop()

  // "HOST:PORT" as bound (the real port when 0 was asked).
  const std::string& address() const { return address_; }
  int port() const { return port_; }
  // Starts accepting; `hand_over` takes ownership of each connected, non-blocking socket.
  void Start(std::function<void(int fd)> hand_over);
  // Stops accepting, closes the listening socket and every connection not yet handed over.
  void Stop();
  ConnectionGateCounters counters() const;

 private:
  ConnectionGate() = default;
  // The loop thread's own state: its epoll, the connections awaiting their preface.
  struct LoopState;
  void Loop();
  // Drops the waiting connections whose handshake time is up; returns epoll's wait in ms.
  int ExpireWaiting(LoopState& s);
  // Accepts what the listener holds (up to 256 at a time).
  void AcceptAll(LoopState& s);
  // One accept(): false when there is nothing more to accept now.
  bool AcceptOne(LoopState& s);
  // Peeks the connection's first bytes: hands it over once the preface is all there, drops it
  // when they differ or the peer closed; leaves it waiting otherwise.
  void Check(LoopState& s, int fd);
  void Drop(LoopState& s, int fd);
  void Hand(LoopState& s, int fd);

  ConnectionGateOptions options_;
  std::string address_;
  int port_ = 0;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: Stop wakes the loop
  std::function<void(int)> hand_over_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> handed_{0}, timed_out_{0}, evicted_{0}, refused_{0}, accept_errors_{0};
};

// Raises the soft RLIMIT_NOFILE to the hard limit (once per process; later calls return the same).
// Returns the soft limit in force.
uint64_t RaiseOpenFileLimit();

}  // namespace scd

#endif  // SCD_BASE_CONNECTION_GATE_H_
