// SessionRouter: the consumer's transfer listener. Producers open sessions to it; each is handed to
// the request that expects it, by the tag in its header (TransferHeader.request_id, "<request
// id>#<target>"). A request registers its tag when its Decode call arrives. The coordinator may
// ask the producer at the same time (an early prefill, coordinator/routed_request.h), so a
// session may arrive first: one whose tag was never expected waits, unread, until its request
// expects it, at most `early_wait` and at most kMaxEarly such sessions at once (each holds at
// most its credit window of bytes); past either it is refused. A session for a request that
// ended (or was cancelled, or whose transfer was reported failed) is refused at once (cancelled,
// naming the tag).
// Thread-safety: thread-safe; sessions are handed over on the transport's connection threads, as
// their headers arrive (SessionAcceptor's handler), and early ones refused on the clock's timer
// thread: the router has no thread of its own.
#ifndef SCD_CONSUMER_SESSION_ROUTER_H_
#define SCD_CONSUMER_SESSION_ROUTER_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "proto/code_chunk_framing.h"
#include "transport/session_acceptor.h"
#include "transport/transfer_session.h"

namespace scd::consumer {

class SessionRouter {
  class Book;  // the expectations, shared with the tickets (session_router.cc)

 public:
  // What Fail found for a tag.
  enum class FailOutcome {
    kWaiting,    // expected, not arrived: the ticket's Wait returns `why` from now on
    kReceiving,  // arrived and still open: cancelled with `why`'s message
    kNone,       // nobody expects it, or its session ended already
  };

  // A registered expectation; unregisters on destruction (a session arriving later is refused).
  // It may outlive its router (a node stopping while requests still run): it then finds the
  // router stopping: Wait is UNAVAILABLE (unless its session had arrived or it was failed),
  // Expect is refused, Fail and the destructor touch only what the tickets share.
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
    // SessionRouter::Fail and FailWaiting for this ticket's tag.
    FailOutcome Fail(const absl::Status& why);
    bool FailWaiting(const absl::Status& why);
    // SessionRouter::Expect on this ticket's router (a takeover's session).
    absl::StatusOr<std::unique_ptr<Ticket>> Expect(const std::string& tag);

   private:
    friend class SessionRouter;
    Ticket(std::shared_ptr<Book> book, std::string tag)
        : book_(std::move(book)), tag_(std::move(tag)) {}
    const std::shared_ptr<Book> book_;
    const std::string tag_;
  };

  // Sessions that arrived before their request at most this many at once.
  static constexpr size_t kMaxEarly = 256;
  // Tags of ended requests remembered (a late session for one is refused at once).
  static constexpr size_t kEndedTags = 4096;

  explicit SessionRouter(std::unique_ptr<transport::SessionAcceptor> acceptor,
                         Clock* clock = Clock::Real(),
                         absl::Duration early_wait = absl::Seconds(5));
  ~SessionRouter();  // stops accepting; pending tickets' waits fail
  SessionRouter(const SessionRouter&) = delete;
  SessionRouter& operator=(const SessionRouter&) = delete;

  const std::string& address() const { return address_; }
  // ALREADY_EXISTS when the tag is expected already.
  absl::StatusOr<std::unique_ptr<Ticket>> Expect(const std::string& tag);

  // The producer will not send (or finish) the session `tag`: the coordinator knows that before
  // this consumer can (a producer dead before its session's header arrived looks like a slow
  // one). REQUIRES: !why.ok().
  FailOutcome Fail(const std::string& tag, const absl::Status& why);
  // Fail, for a session that has not arrived only (a wait that timed out): one that arrived
  // meanwhile is left alone. Returns whether it failed the wait.
  bool FailWaiting(const std::string& tag, const absl::Status& why);
  int64_t refused() const;
  // Sessions that arrived before their request and wait for it.
  size_t early() const;
  // Transfer sessions producers have open to this consumer (not yet ended).
  size_t open_sessions() const;

 private:
  // Hands `session` to the ticket that expects its tag, keeps it for a request yet to come, or
  // refuses it.
  void Deliver(std::shared_ptr<transport::ReceiveSession> session);
  // Refuses the early session `tag` if it still waits (its wait ended).
  void RefuseEarly(const std::string& tag);

  std::unique_ptr<transport::SessionAcceptor> acceptor_;
  const std::string address_;
  const std::shared_ptr<Book> book_;
};

}  // namespace scd::consumer

#endif  // SCD_CONSUMER_SESSION_ROUTER_H_
