// SessionRouter: the consumer's transfer listener. Producers open sessions to it; each is handed to
// the request that expects it, by the tag in its header (TransferHeader.request_id, "<request
// id>#<target>"). A request registers its tag when admitted, before the producer is asked to send,
// so a session for a tag nobody expects (never admitted, already ended, or cancelled) is refused
// at once (cancelled, naming the tag) and its bytes are never buffered.
// Thread-safety: thread-safe; sessions are handed over on the transport's connection threads, as
// their headers arrive (SessionAcceptor's handler): the router has no thread of its own.
#ifndef SCD_CONSUMER_SESSION_ROUTER_H_
#define SCD_CONSUMER_SESSION_ROUTER_H_

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/code_chunk_framing.h"
#include "transport/session_acceptor.h"
#include "transport/transfer_session.h"

namespace scd::consumer {

class SessionRouter {
 public:
  // A registered expectation; unregisters on destruction (a session arriving later is refused).
  class Ticket {
   public:
    ~Ticket();
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    // The session, once it arrived; DEADLINE_EXCEEDED after `timeout`; the status Fail set when
    // the producer was reported failed before its session arrived.
    absl::StatusOr<std::shared_ptr<transport::ReceiveSession>> Wait(absl::Duration timeout);
    // Calls `ready` once, when Wait would return at once (the session arrived, Fail was called,
    // the router stops): on the thread that made it so, or on this one when it is so already.
    // Once per ticket.
    void OnArrival(std::function<void()> ready);

   private:
    friend class SessionRouter;
    Ticket(SessionRouter* router, std::string tag) : router_(router), tag_(std::move(tag)) {}
    SessionRouter* router_;
    const std::string tag_;
  };

  explicit SessionRouter(std::unique_ptr<transport::SessionAcceptor> acceptor);
  ~SessionRouter();  // stops accepting; pending tickets' waits fail
  SessionRouter(const SessionRouter&) = delete;
  SessionRouter& operator=(const SessionRouter&) = delete;

  const std::string& address() const { return address_; }
  // ALREADY_EXISTS when the tag is expected already.
  absl::StatusOr<std::unique_ptr<Ticket>> Expect(const std::string& tag);
  // What Fail found for a tag.
  enum class FailOutcome {
    kWaiting,    // expected, not arrived: the ticket's Wait returns `why` from now on
    kReceiving,  // arrived and still open: cancelled with `why`'s message
    kNone,       // nobody expects it, or its session ended already
  };
  // The producer will not send (or finish) the session `tag`: the coordinator knows that before
  // this consumer can (a producer dead before its session's header arrived looks like a slow
  // one). REQUIRES: !why.ok().
  FailOutcome Fail(const std::string& tag, const absl::Status& why);
  // Fail, for a session that has not arrived only (a wait that timed out): one that arrived
  // meanwhile is left alone. Returns whether it failed the wait.
  bool FailWaiting(const std::string& tag, const absl::Status& why);
  int64_t refused() const;
  // Transfer sessions producers have open to this consumer (not yet ended).
  size_t open_sessions() const;

 private:
  struct Slot {
    std::shared_ptr<transport::ReceiveSession> session;
    absl::Status failed;  // set by Fail before the session arrived; a later arrival is refused
    std::function<void()> on_arrival;  // Ticket::OnArrival's, until called
  };
  // Hands `session` to the ticket that expects its tag, or refuses it.
  void Deliver(std::shared_ptr<transport::ReceiveSession> session);
  void Forget(const std::string& tag);

  std::unique_ptr<transport::SessionAcceptor> acceptor_;
  const std::string address_;
  mutable absl::Mutex mu_;
  std::map<std::string, Slot> expected_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t refused_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace scd::consumer

#endif  // SCD_CONSUMER_SESSION_ROUTER_H_
