#include "consumer/session_router.h"

#include <spdlog/spdlog.h>

#include <deque>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "transport/session_acceptor.h"

namespace scd::consumer {

// The expectations and the sessions handed to them. Held by the router and by every ticket, so a
// ticket (its request) may outlive the router: it then finds `stopping` set.
class SessionRouter::Book : public std::enable_shared_from_this<Book> {
 public:
  struct Slot {
    std::shared_ptr<transport::ReceiveSession> session;
    absl::Status failed;  // set by Fail before the session arrived; a later arrival is refused
    std::function<void()> on_arrival;  // Ticket::OnArrival's, until called
  };
  // A session that arrived before its request expected it.
  struct Early {
    std::shared_ptr<transport::ReceiveSession> session;
    Clock::Timer refuse;  // at the end of its wait (destroyed outside mu: its callback takes it)
  };

  Book(Clock* clock, absl::Duration early_wait) : clock(clock), early_wait(early_wait) {}

  absl::StatusOr<std::unique_ptr<Ticket>> Expect(const std::string& tag);
  FailOutcome Fail(const std::string& tag, const absl::Status& why);
  bool FailWaiting(const std::string& tag, const absl::Status& why);
  void Forget(const std::string& tag);
  void OnArrival(const std::string& tag, std::function<void()> ready);
  absl::StatusOr<std::shared_ptr<transport::ReceiveSession>> Wait(const std::string& tag,
                                                                  absl::Duration timeout);
  void NoteEnded(const std::string& tag) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  Clock* const clock;
  const absl::Duration early_wait;
  mutable absl::Mutex mu;
  std::map<std::string, Slot> expected ABSL_GUARDED_BY(mu);
  std::map<std::string, Early> early ABSL_GUARDED_BY(mu);
  std::set<std::string> ended ABSL_GUARDED_BY(mu);
  std::deque<std::string> ended_order ABSL_GUARDED_BY(mu);  // oldest first
  bool stopping ABSL_GUARDED_BY(mu) = false;
  int64_t refused ABSL_GUARDED_BY(mu) = 0;
};

SessionRouter::SessionRouter(std::unique_ptr<transport::SessionAcceptor> acceptor, Clock* clock,
                             absl::Duration early_wait)
    : acceptor_(std::move(acceptor)),
      address_(acceptor_->address()),
      book_(std::make_shared<Book>(clock, early_wait)) {
  acceptor_->SetSessionHandler(
      [this](std::shared_ptr<transport::ReceiveSession> session) { Deliver(std::move(session)); });
}

SessionRouter::~SessionRouter() {
  std::vector<std::function<void()>> waiting;
  std::map<std::string, Book::Early> early;  // their timers cancelled outside the lock
  {
    absl::MutexLock lock(&book_->mu);
    book_->stopping = true;
    for (auto& [tag, slot] : book_->expected) {
      if (slot.on_arrival) waiting.push_back(std::move(slot.on_arrival));
      slot.on_arrival = nullptr;
    }
    early.swap(book_->early);
  }
  for (const auto& ready : waiting) ready();  // their Wait says the consumer stops
  early.clear();
  acceptor_->Close();  // no session is handed over after this returns (the early ones end)
}

void SessionRouter::Deliver(std::shared_ptr<transport::ReceiveSession> session) {
  const std::string tag = session->header().request_id();
  std::function<void()> ready;
  {
    Book& book = *book_;
    absl::MutexLock lock(&book.mu);
    if (book.stopping) return;  // the acceptor's Close ends it
    auto it = book.expected.find(tag);
    if (it != book.expected.end() && it->second.session == nullptr && it->second.failed.ok()) {
      it->second.session = std::move(session);
      ready = std::move(it->second.on_arrival);
      it->second.on_arrival = nullptr;
    } else if (it == book.expected.end() && book.ended.count(tag) == 0 &&
               book.early.count(tag) == 0 && book.early.size() < kMaxEarly) {
      // Ahead of its request (an early prefill): kept, unread, until the request expects it.
      Book::Early& early = book.early[tag];
      early.session = std::move(session);
      early.refuse = Clock::Timer(book.clock, book.clock->Now() + book.early_wait,
                                  [this, tag] { RefuseEarly(tag); });
      return;
    } else {
      ++book.refused;
    }
  }
  if (session == nullptr) {  // handed over
    if (ready) ready();
    return;
  }
  spdlog::warn("[{}] refused a transfer session nobody expects", tag);
  session->Cancel(absl::StrCat("no admitted request expects session '", tag, "'"));
}

void SessionRouter::RefuseEarly(const std::string& tag) {
  Book::Early refused;  // its timer (this callback's own) let go outside the lock
  {
    absl::MutexLock lock(&book_->mu);
    auto it = book_->early.find(tag);
    if (it == book_->early.end()) return;
    refused = std::move(it->second);
    book_->early.erase(it);
    ++book_->refused;
    book_->NoteEnded(tag);
  }
  spdlog::warn("[{}] refused a transfer session no request expected within {}", tag,
               absl::FormatDuration(book_->early_wait));
  refused.session->Cancel(absl::StrCat("no admitted request expects session '", tag, "'"));
}

absl::StatusOr<std::unique_ptr<SessionRouter::Ticket>> SessionRouter::Expect(
    const std::string& tag) {
  return book_->Expect(tag);
}

SessionRouter::FailOutcome SessionRouter::Fail(const std::string& tag, const absl::Status& why) {
  return book_->Fail(tag, why);
}

bool SessionRouter::FailWaiting(const std::string& tag, const absl::Status& why) {
  return book_->FailWaiting(tag, why);
}

size_t SessionRouter::open_sessions() const { return acceptor_->open_sessions(); }

int64_t SessionRouter::refused() const {
  absl::MutexLock lock(&book_->mu);
  return book_->refused;
}

size_t SessionRouter::early() const {
  absl::MutexLock lock(&book_->mu);
  return book_->early.size();
}

absl::StatusOr<std::unique_ptr<SessionRouter::Ticket>> SessionRouter::Book::Expect(
    const std::string& tag) {
  Clock::Timer early_wait;  // a waiting session's timer, cancelled outside the lock
  absl::MutexLock lock(&mu);
  if (stopping) return absl::UnavailableError("the consumer is shutting down");
  auto [it, inserted] = expected.emplace(tag, Slot{});
  if (!inserted) {
    return absl::AlreadyExistsError(absl::StrCat("session '", tag, "' is expected already"));
  }
  if (auto found = early.find(tag); found != early.end()) {  // it came first
    it->second.session = std::move(found->second.session);
    early_wait = std::move(found->second.refuse);
    early.erase(found);
  }
  return std::unique_ptr<Ticket>(new Ticket(shared_from_this(), tag));
}

void SessionRouter::Book::NoteEnded(const std::string& tag) {
  if (!ended.insert(tag).second) return;
  ended_order.push_back(tag);
  if (ended_order.size() > kEndedTags) {
    ended.erase(ended_order.front());
    ended_order.pop_front();
  }
}

void SessionRouter::Book::Forget(const std::string& tag) {
  std::shared_ptr<transport::ReceiveSession> untaken;
  {
    absl::MutexLock lock(&mu);
    auto it = expected.find(tag);
    if (it == expected.end()) return;
    untaken = std::move(it->second.session);
    expected.erase(it);
    NoteEnded(tag);
  }
  // The request ended (any way) with its session still open: end it so the producer stops.
  if (untaken != nullptr && untaken->state() == transport::SessionState::kOpen) {
    untaken->Cancel("the consumer's request ended");
  }
}

SessionRouter::FailOutcome SessionRouter::Book::Fail(const std::string& tag,
                                                     const absl::Status& why) {
  std::shared_ptr<transport::ReceiveSession> arrived;
  std::function<void()> ready;
  {
    absl::MutexLock lock(&mu);
    auto it = expected.find(tag);
    if (it == expected.end()) return FailOutcome::kNone;
    if (it->second.session == nullptr) {
      if (it->second.failed.ok()) it->second.failed = why;
      ready = std::move(it->second.on_arrival);
      it->second.on_arrival = nullptr;
    } else {
      arrived = it->second.session;
    }
  }
  if (arrived == nullptr) {
    if (ready) ready();
    return FailOutcome::kWaiting;
  }
  if (arrived->state() != transport::SessionState::kOpen) return FailOutcome::kNone;
  arrived->Cancel(std::string(why.message()));
  return FailOutcome::kReceiving;
}

bool SessionRouter::Book::FailWaiting(const std::string& tag, const absl::Status& why) {
  std::function<void()> ready;
  {
    absl::MutexLock lock(&mu);
    auto it = expected.find(tag);
    if (it == expected.end() || it->second.session != nullptr || !it->second.failed.ok()) {
      return false;
    }
    it->second.failed = why;
    ready = std::move(it->second.on_arrival);
    it->second.on_arrival = nullptr;
  }
  if (ready) ready();
  return true;
}

void SessionRouter::Book::OnArrival(const std::string& tag, std::function<void()> ready) {
  {
    absl::MutexLock lock(&mu);
    auto it = expected.find(tag);
    if (!stopping && it != expected.end() && it->second.session == nullptr &&
        it->second.failed.ok()) {
      it->second.on_arrival = std::move(ready);
      return;
    }
  }
  ready();  // Wait returns at once already
}

absl::StatusOr<std::shared_ptr<transport::ReceiveSession>> SessionRouter::Book::Wait(
    const std::string& tag, absl::Duration timeout) {
  absl::MutexLock lock(&mu);
  auto arrived = [this, &tag]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto it = expected.find(tag);
    return stopping ||
           (it != expected.end() && (it->second.session != nullptr || !it->second.failed.ok()));
  };
  mu.AwaitWithTimeout(absl::Condition(&arrived), timeout);
  auto it = expected.find(tag);
  if (it != expected.end() && it->second.session != nullptr) return it->second.session;
  if (it != expected.end() && !it->second.failed.ok()) return it->second.failed;
  if (stopping) return absl::UnavailableError("the consumer is shutting down");
  return absl::DeadlineExceededError(
      absl::StrCat("no transfer session for '", tag, "' within ", absl::FormatDuration(timeout)));
}

SessionRouter::Ticket::~Ticket() { book_->Forget(tag_); }

void SessionRouter::Ticket::OnArrival(std::function<void()> ready) {
  book_->OnArrival(tag_, std::move(ready));
}

absl::StatusOr<std::shared_ptr<transport::ReceiveSession>> SessionRouter::Ticket::Wait(
    absl::Duration timeout) {
  return book_->Wait(tag_, timeout);
}

SessionRouter::FailOutcome SessionRouter::Ticket::Fail(const absl::Status& why) {
  return book_->Fail(tag_, why);
}

bool SessionRouter::Ticket::FailWaiting(const absl::Status& why) {
  return book_->FailWaiting(tag_, why);
}

absl::StatusOr<std::unique_ptr<SessionRouter::Ticket>> SessionRouter::Ticket::Expect(
    const std::string& tag) {
  return book_->Expect(tag);
}

}  // namespace scd::consumer
