// SessionAcceptor: the receiving side of a transfer endpoint. It accepts links on a Listener, makes
// a TransferConnection of each, and hands out the sessions peers open on any of them: queued for
// Accept, or, once a handler is set, handed to it as each session's header arrives (on the
// connection's thread; no thread or timed wait of the taker's).
// Thread-safety: thread-safe.
#ifndef SCD_TRANSPORT_SESSION_ACCEPTOR_H_
#define SCD_TRANSPORT_SESSION_ACCEPTOR_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "transport/transfer_session.h"
#include "transport/transport.h"

namespace scd::transport {

// Accepts links on a listener and the sessions peers open on them.
class SessionAcceptor {
 public:
  SessionAcceptor(std::unique_ptr<Listener> listener, ConnectionOptions options);
  ~SessionAcceptor();
  // The next session any peer opened; DeadlineExceeded on timeout, Cancelled after Close.
  // REQUIRES: no session handler set.
  absl::StatusOr<std::shared_ptr<ReceiveSession>> Accept(absl::Duration timeout);
  using SessionHandler = std::function<void(std::shared_ptr<ReceiveSession> session)>;
  // From now on every session goes to `handler` (those queued already, at once), one at a time,
  // until Close; once Close returns it is never called again. It must not call into this
  // acceptor.
  void SetSessionHandler(SessionHandler handler);
  std::string address() const { return listener_->address(); }
  void Close();
  // Connections held: every live one, and a dead one (its link gone, its sessions ended) until
  // the accept loop's next turn (at most 100 ms) drops it with its threads.
  size_t connections() const;
  // Sessions not yet ended on every accepted connection.
  size_t open_sessions() const;

 private:
  struct ReadyQueue;
  void AcceptLoop();
  // Drops the connections whose links are gone: a peer that died holds nothing here, whether or
  // not another connects after it.
  void ForgetDeadConnections();

  std::unique_ptr<Listener> listener_;
  const ConnectionOptions options_;
  // Shared with the connections' callbacks, which may outlive a call into this object.
  std::shared_ptr<ReadyQueue> ready_;
  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<TransferConnection>> connections_ ABSL_GUARDED_BY(mu_);
  std::thread accept_thread_;
};

}  // namespace scd::transport

#endif  // SCD_TRANSPORT_SESSION_ACCEPTOR_H_
