#include "consumer/session_router.h"

#include <spdlog/spdlog.h>

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "transport/session_acceptor.h"

namespace scd::consumer {

SessionRouter::SessionRouter(std::unique_ptr<transport::SessionAcceptor> acceptor, Clock* clock,
                             absl::Duration early_wait)
    : acceptor_(std::move(acceptor)),
      address_(acceptor_->address()),
      clock_(clock),
      early_wait_(early_wait) {
  acceptor_->SetSessionHandler(
      [this](std::shared_ptr<transport::ReceiveSession> session) { Deliver(std::move(session)); });
}

SessionRouter::~SessionRouter() {
  std::vector<std::function<void()>> waiting;
  std::map<std::string, Early> early;  // their timers cancelled outside the lock
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (auto& [tag, slot] : expected_) {
      if (slot.on_arrival) waiting.push_back(std::move(slot.on_arrival));
      slot.on_arrival = nullptr;
    }
    early.swap(early_);
  }
  for (const auto& ready : waiting) ready();  // their Wait says the consumer stops
  early.clear();
  acceptor_->Close();  // no session is handed over after this returns (the early ones end)
}

void SessionRouter::Deliver(std::shared_ptr<transport::ReceiveSession> session) {
  const std::string tag = session->header().request_id();
  std::function<void()> ready;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;  // the acceptor's Close ends it
    auto it = expected_.find(tag);
    if (it != expected_.end() && it->second.session == nullptr && it->second.failed.ok()) {
      it->second.session = std::move(session);
      ready = std::move(it->second.on_arrival);
      it->second.on_arrival = nullptr;
    } else if (it == expected_.end() && ended_.count(tag) == 0 && early_.count(tag) == 0 &&
               early_.size() < kMaxEarly) {
      // Ahead of its request (an early prefill): kept, unread, until the request expects it.
      Early& early = early_[tag];
      early.session = std::move(session);
      early.refuse =
          Clock::Timer(clock_, clock_->Now() + early_wait_, [this, tag] { RefuseEarly(tag); });
      return;
    } else {
      ++refused_;
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
  Early refused;  // its timer (this callback's own) let go outside the lock
  {
    absl::MutexLock lock(&mu_);
    auto it = early_.find(tag);
    if (it == early_.end()) return;
    refused = std::move(it->second);
    early_.erase(it);
    ++refused_;
    NoteEnded(tag);
  }
  spdlog::warn("[{}] refused a transfer session no request expected within {}", tag,
               absl::FormatDuration(early_wait_));
  refused.session->Cancel(absl::StrCat("no admitted request expects session '", tag, "'"));
}

absl::StatusOr<std::unique_ptr<SessionRouter::Ticket>> SessionRouter::Expect(
    const std::string& tag) {
  Clock::Timer early_wait;  // a waiting session's timer, cancelled outside the lock
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = expected_.emplace(tag, Slot{});
  if (!inserted) {
    return absl::AlreadyExistsError(absl::StrCat("session '", tag, "' is expected already"));
  }
  if (auto early = early_.find(tag); early != early_.end()) {  // it came first
    it->second.session = std::move(early->second.session);
    early_wait = std::move(early->second.refuse);
    early_.erase(early);
  }
  return std::unique_ptr<Ticket>(new Ticket(this, tag));
}

void SessionRouter::NoteEnded(const std::string& tag) {
  if (!ended_.insert(tag).second) return;
  ended_order_.push_back(tag);
  if (ended_order_.size() > kEndedTags) {
    ended_.erase(ended_order_.front());
    ended_order_.pop_front();
  }
}

void SessionRouter::Forget(const std::string& tag) {
  std::shared_ptr<transport::ReceiveSession> untaken;
  {
    absl::MutexLock lock(&mu_);
    auto it = expected_.find(tag);
    if (it == expected_.end()) return;
    untaken = std::move(it->second.session);
    expected_.erase(it);
    NoteEnded(tag);
  }
  // The request ended (any way) with its session still open: end it so the producer stops.
  if (untaken != nullptr && untaken->state() == transport::SessionState::kOpen) {
    untaken->Cancel("the consumer's request ended");
  }
}

SessionRouter::FailOutcome SessionRouter::Fail(const std::string& tag, const absl::Status& why) {
  std::shared_ptr<transport::ReceiveSession> arrived;
  std::function<void()> ready;
  {
    absl::MutexLock lock(&mu_);
    auto it = expected_.find(tag);
    if (it == expected_.end()) return FailOutcome::kNone;
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

bool SessionRouter::FailWaiting(const std::string& tag, const absl::Status& why) {
  std::function<void()> ready;
  {
    absl::MutexLock lock(&mu_);
    auto it = expected_.find(tag);
    if (it == expected_.end() || it->second.session != nullptr || !it->second.failed.ok()) {
      return false;
    }
    it->second.failed = why;
    ready = std::move(it->second.on_arrival);
    it->second.on_arrival = nullptr;
  }
  if (ready) ready();
  return true;
}

size_t SessionRouter::open_sessions() const { return acceptor_->open_sessions(); }

int64_t SessionRouter::refused() const {
  absl::MutexLock lock(&mu_);
  return refused_;
}

size_t SessionRouter::early() const {
  absl::MutexLock lock(&mu_);
  return early_.size();
}

SessionRouter::Ticket::~Ticket() { router_->Forget(tag_); }

void SessionRouter::Ticket::OnArrival(std::function<void()> ready) {
  {
    absl::MutexLock lock(&router_->mu_);
    auto it = router_->expected_.find(tag_);
    if (!router_->stopping_ && it != router_->expected_.end() && it->second.session == nullptr &&
        it->second.failed.ok()) {
      it->second.on_arrival = std::move(ready);
      return;
    }
  }
  ready();  // Wait returns at once already
}

absl::StatusOr<std::shared_ptr<transport::ReceiveSession>> SessionRouter::Ticket::Wait(
    absl::Duration timeout) {
  absl::MutexLock lock(&router_->mu_);
  auto arrived = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(router_->mu_) {
    auto it = router_->expected_.find(tag_);
    return router_->stopping_ ||
           (it != router_->expected_.end() &&
            (it->second.session != nullptr || !it->second.failed.ok()));
  };
  router_->mu_.AwaitWithTimeout(absl::Condition(&arrived), timeout);
  auto it = router_->expected_.find(tag_);
  if (it != router_->expected_.end() && it->second.session != nullptr) return it->second.session;
  if (it != router_->expected_.end() && !it->second.failed.ok()) return it->second.failed;
  if (router_->stopping_) return absl::UnavailableError("the consumer is shutting down");
  return absl::DeadlineExceededError(
      absl::StrCat("no transfer session for '", tag_, "' within ", absl::FormatDuration(timeout)));
}

}  // namespace scd::consumer
